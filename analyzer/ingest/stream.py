"""Streaming decode: the ``traceEvents`` array in batches of whole events, never the whole file.

The inflated JSON arrives in chunks (:func:`analyzer.ingest.files.iter_trace_chunks`). Once the
array's opening ``[`` is found, each step cuts the buffered text after the last ``}`` that is
followed by a comma and the next object's ``{``, and decodes that slice, wrapped in ``[...]``,
as a list of typed events. A cut that falls inside a string or a nested object cannot decode
as a complete array (the string or the brackets stay open), so msgspec itself validates every
cut; when a slice fails, an exact scanner (string-, escape- and depth-aware, numpy-vectorised)
finds the true last boundary and tells a bad cut from bad data. Whatever follows the last cut
(the final events, the closing ``]`` and any later keys) is decoded together with the text
before the array, which also yields the metadata (``distributedInfo``, ``deviceProperties``...).
Peak memory is a few chunks plus the columns, whatever the file size.

Bounds (issue 41: the cost follows the file's size, never its values): the text before the
array (HEAD_LIMIT), one event or a run of text with no event boundary (MAX_EVENT_BYTES) and the
text after the array (TAIL_LIMIT) are each refused past their limit, as soon as the limit is
crossed, naming the file and, when the run is one string, the field holding it; each byte is
scanned a bounded number of times, so time stays linear whatever the layout.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from typing import Callable, Iterator

import msgspec
import numpy as np

from analyzer.base.errors import InputError
from analyzer.ingest.schema import TRACE_DECODER, Event, TraceFile

EVENTS_DECODER = msgspec.json.Decoder(list[Event])
HEAD_LIMIT = 64 << 20  # the array must open within this many bytes (metadata before the events)
TAIL_LIMIT = 64 << 20  # what follows the events array (metadata after the events)
# No real event, nor any one string in a trace, is this long (Kineto's longest: a few KB of
# shapes); past it, text with no event boundary is refused (and costs at most 8 chunk joins).
MAX_EVENT_BYTES = 32 << 20
# The events before a cut are decoded and handed on in pieces of about this many bytes (a piece's
# events, a few thousand, stay in the cache while the columns are read from them; decoded 4 MB
# at a time they did not: docs/scale.md, issue 42's fifth pass).
PIECE_BYTES = 1 << 20
# A "}" then a comma then "{": how events are separated. A nested object inside an event is
# mostly followed by another key (`}, "key"`), so this rarely cuts inside an event (a bare `},`
# did in ~5 % of cuts on FSDP2 traces, each costing an exact scan of the buffer).
_CANDIDATE_CUT = re.compile(rb"\}[ \t\r\n]*,(?=[ \t\r\n]*\{)")
_COMMA_AFTER = re.compile(rb"[ \t\r\n]*,")
_KEY = b'"traceEvents"'
_WS = b" \t\r\n"
_SCAN_BLOCK = 4 << 20
# A NaN/Infinity literal in value position (after ':', ',' or '[', before ',', '}' or ']').
_NONFINITE = re.compile(rb"(?<=[:\[,])([ \t\r\n]*)(?:-?Infinity|NaN)(?=[ \t\r\n]*[,\]}])")
# A number literal in value position that may lie beyond every field: an integer of more
# digits than Python converts (4,300), or a float past a double (a 3-digit exponent, or 309+
# digits before the point); _null_if_beyond decides.
_HUGE_NUMBER = re.compile(rb"(?<=[:\[,])([ \t\r\n]*)(-?(?:\d{309,}(?:\.\d*)?(?:[eE][-+]?\d+)?"
                          rb"|\d+(?:\.\d*)?[eE]\+?0*[1-9]\d{2,}))(?=[ \t\r\n]*[,\]}])")

OnEvents = Callable[[list], None]


class TooLong(InputError):
    """A run of text past its limit (HEAD_LIMIT, MAX_EVENT_BYTES, TAIL_LIMIT): refused at once,
    by every loader (the two-process one does not retry it in one)."""


class Decoding:
    """Where a decode stands, for error messages that point into the file."""

    def __init__(self, path) -> None:
        self.path = path
        self.events_seen = 0
        self.replaced_utf8 = 0  # slices whose invalid UTF-8 was replaced (names only)
        self.replaced_nonfinite = 0  # slices whose NaN/Infinity literals were read as null
        self.replaced_huge: list[str] = []  # where the first number beyond any field was, per slice
        self.array_closed = False  # the traceEvents array ended: the rest is one final decode

    def decode(self, decoder, data: bytes | memoryview):
        """Decode, tolerating three departures from JSON, each once and with a warning: invalid
        UTF-8 in strings, NaN/Infinity literals (Python's json.dump writes them), and numbers
        beyond any field (an integer of thousands of digits, 1e400): read as null."""
        fixed_utf8 = fixed_nonfinite = fixed_huge = False
        while True:
            try:
                return decoder.decode(data)
            except RecursionError:
                raise InputError(self.path, "invalid JSON: nested deeper than any trace (a value inside "
                                            "thousands of brackets)") from None
            except msgspec.DecodeError as exc:
                data = bytes(data)  # a view of a buffer (decode_cut) is fixed in a copy
                message = str(exc)
                if "UTF-8" in message and not fixed_utf8:
                    data, fixed_utf8 = data.decode("utf-8", "replace").encode("utf-8"), True
                    self.replaced_utf8 += 1
                    continue
                if "out of range" in message and not fixed_huge:
                    fixed, fixed_huge = _HUGE_NUMBER.sub(_null_if_beyond, data), True
                    if fixed != data:
                        data = fixed
                        self.replaced_huge.append(self._field_of(message))
                        continue
                match = re.search(r"\(byte (\d+)\)", message)
                if match and not fixed_nonfinite and _nonfinite_literal_at(data, int(match.group(1))):
                    data, fixed_nonfinite = _NONFINITE.sub(rb"\1null", data), True
                    self.replaced_nonfinite += 1
                    continue
                raise

    def error(self, exc: msgspec.MsgspecError, to_file_offset: Callable[[int], int],
              events_before: int) -> InputError:
        message = str(exc)
        if isinstance(exc, msgspec.ValidationError):
            where = r"\$\[(\d+)\]" if "$[" in message else r"\$\.traceEvents\[(\d+)\]"
            message = re.sub(where, lambda m: f"$.traceEvents[{events_before + int(m.group(1))}]", message)
            return InputError(self.path, f"not a Kineto trace: {message}")
        match = re.search(r"\(byte (\d+)\)", message)
        if match:
            at = int(match.group(1))
            message = message.replace(match.group(0), f"(byte {to_file_offset(at):,} of the JSON text)")
        if "truncated" in message:
            return InputError(self.path, "invalid JSON: the text ends early (truncated file?)")
        return InputError(self.path, f"invalid JSON: {message}")


    def _field_of(self, message: str) -> str:
        """The field a validation message names, as a path into the whole trace."""
        match = re.search(r"at `(\$[^`]*)`", message)
        if not match:
            return "?"
        # a batch's decode names ``$[k]``, the tail's (a whole document) ``$.traceEvents[k]``: both
        # count from the first event not yet seen
        return re.sub(r"^\$(?:\.traceEvents)?\[(\d+)\]",
                      lambda m: f"$.traceEvents[{self.events_seen + int(m.group(1))}]", match.group(1))


def _null_if_beyond(match: re.Match) -> bytes:
    """``null`` for a literal no field holds (an integer past 4,300 digits, a float past a double)."""
    text = match.group(2)
    if re.fullmatch(rb"-?\d+", text):
        beyond = len(text.lstrip(b"-")) > 4300
    else:
        beyond = not math.isfinite(float(text))
    return match.group(1) + b"null" if beyond else match.group(0)


def _nonfinite_literal_at(data: bytes, at: int) -> bool:
    window = data[max(at - 1, 0):at + 9]
    return any(literal in window for literal in (b"NaN", b"Infinity"))


def decode_stream(path, chunks: Iterator[bytes], on_events: OnEvents) -> tuple[TraceFile, Decoding]:
    """Feed ``on_events`` every event of the trace in order, batch by batch; return the trace's
    metadata (``traceEvents`` emptied) and the decoding record (for warnings)."""
    state = Decoding(path)
    chunks = iter(chunks)
    buf, array_at = read_head(chunks, path)
    if array_at is None:  # the whole text (at most HEAD_LIMIT) holds no array start
        return decode_final(state, buf, b"", 0, on_events), state
    head = buf[:array_at]  # up to and including the array's "["
    store = bracketed(memoryview(buf)[array_at:])
    offset = array_at  # file offset of the text's first byte (store[1])
    while True:
        consumed = _decode_batches(state, store, offset, on_events)
        offset += consumed
        chunk = next(chunks, None)
        if chunk is None or state.array_closed:
            break
        store = bracketed(memoryview(store)[1 + consumed:], chunk)
    tail = memoryview(store)[1 + consumed:]
    if chunk is not None:  # the array closed: the rest is metadata, gathered up to its limit
        tail = read_tail(path, tail, chunk, chunks)
    return decode_final(state, head + tail, head, offset, on_events), state


def read_tail(path, tail, chunk: bytes, chunks: Iterator[bytes]) -> bytes:
    """The text after the events array: its pieces gathered (one join), refused past TAIL_LIMIT."""
    parts, size = [bytes(tail), chunk], len(tail) + len(chunk)
    for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > TAIL_LIMIT:
            raise TooLong(path, too_long(b"".join(parts), 0, TAIL_LIMIT, "the text after the traceEvents array"))
    return b"".join(parts)


def too_long(buf, start: int, limit: int, what: str, where: str = "") -> str:
    """Why a run of text past ``limit`` is refused: the field whose string value it is (when it
    is one; ``where``: the event holding it), else ``what``."""
    field = open_string_field(buf, start)
    if field is not None:
        return (f"the value of {field}{' in ' + where if where else ''} is a string longer than "
                f"{limit:,} bytes (no trace holds one)")
    return f"{what} is longer than {limit:,} bytes (no trace holds that much)"


def open_string_field(buf, start: int) -> str | None:
    """The key (quoted, at most 80 characters) whose string value is still open at the end of
    ``buf`` (scanned from ``start``, outside strings), or None when the end is not in a string."""
    view = bytes(memoryview(buf)[start:])
    # Without a backslash every quote counts (C speed); else the exact scanner.
    in_string = view.count(b'"') % 2 == 1 if b"\\" not in view else scan_state(view, 0, len(view))[1]
    if not in_string:
        return None
    opener = len(view)
    while True:  # the string's own bytes hold no unescaped quote: the last one opens it
        opener = view.rfind(b'"', 0, opener)
        before = opener
        while before > 0 and view[before - 1] == 92:  # each backslash is counted once
            before -= 1
        if opener < 0 or (opener - before) % 2 == 0:
            break
    key = re.search(rb'"((?:[^"\\]|\\.){1,80})"[ \t\r\n]*:[ \t\r\n]*\Z', view[max(0, opener - 400):max(opener, 0)])
    if key is None:
        return "an array element"
    return '"' + key.group(1).decode("utf-8", "replace").encode("unicode_escape").decode("ascii") + '"'


def bracketed(*parts) -> bytearray:
    """``[`` then the parts, in one fresh buffer (one copy per chunk). The events before a cut
    are decoded where they lie, the comma after the last one briefly read as ``]``
    (:func:`decode_cut`), instead of being copied out with brackets around them. The buffer
    is written in place (that one byte) but never resized: a view of it (np.frombuffer, a
    memoryview) can outlive its line when something holds the frame (Dask's workers sample
    thread stacks), and resizing a bytearray while a view lives raises BufferError (issue 13)."""
    return bytearray().join((b"[", *parts))


def advance(buf: bytes, consumed: int, chunk: bytes) -> bytes:
    """The text after ``consumed`` then ``chunk``, in a fresh buffer. Buffers are immutable
    ``bytes``, never resized in place: a view of one (np.frombuffer, a memoryview) can outlive
    its line when something holds the frame (Dask's workers sample thread stacks), and
    resizing a bytearray while a view lives raises BufferError (issue 13)."""
    if consumed >= len(buf):
        return bytes(chunk)  # no copy when the chunk is already bytes
    return b"".join((memoryview(buf)[consumed:], chunk))


def read_head(chunks: Iterator[bytes], path=None) -> tuple[bytes, int | None]:
    """Read chunks until the traceEvents array opens: (text read so far, offset just after the
    array's ``[``; None: the text ended without one, and is whole). Past HEAD_LIMIT bytes, or a
    document that cannot hold the array (not an object or array, ``traceEvents`` not a list),
    it is refused, naming the field whose string is that long."""
    buf = b""
    finder = ArrayFinder()
    for chunk in chunks:
        buf = advance(buf, 0, chunk)
        array_at = finder.feed(buf)
        if array_at is not None and array_at >= 0:
            return buf, array_at
        if array_at == -1 and len(buf) >= 4096:
            raise InputError(path, "not a Kineto trace: the JSON text is not an object with a traceEvents list, "
                                   "nor an array of events")
        if len(buf) > HEAD_LIMIT:
            raise TooLong(path, too_long(buf, 0, HEAD_LIMIT, "the text before the traceEvents array"))
    return buf, None


_WAIT = -2


class ArrayFinder:
    """Finds the ``[`` opening the traceEvents array in a growing buffer, scanning each byte
    once (the state carried between calls): a head with a key named ``traceEvents`` in
    millions of strings costs one scan, not one per occurrence."""

    _MARGIN = 256  # bytes left unscanned at the buffer's end: a key and its ":" arrive whole
    _BLOCK = 64 << 10  # scanned per step around a key (a trace's key is in its first KB)

    def __init__(self) -> None:
        self.first: int | None = None  # the document's first non-blank byte
        self.scanned = 0  # bytes scanned so far, and the state after them
        self.state = (False, False, 0)

    def feed(self, buf: bytes) -> int | None:
        """Offset just after the ``[`` that opens the traceEvents array (or a bare top-level
        array) in ``buf``, which extends the previous call's buffer; None: not in it yet; -1:
        this document cannot hold one."""
        if self.first is None:
            self.first = next((i for i, c in enumerate(buf[:4096]) if c not in _WS), None)
            if self.first is None:
                return None if len(buf) < 4096 else -1
            if buf[self.first] == ord("["):
                return self.first + 1
            if buf[self.first] != ord("{"):
                return -1
            self.scanned = self.first
        stop = len(buf) - self._MARGIN
        while self.scanned < stop:
            # Only text before a "traceEvents" is scanned (a head without one costs a find).
            at = buf.find(_KEY, self.scanned, stop + len(_KEY) - 1)
            if not 0 <= at < stop:
                return None
            if at - self.scanned > self._BLOCK:  # the state up to the block holding it
                self.state = _scan_from(buf, self.scanned, at, self.state)
                self.scanned = at
            lo, hi = self.scanned, min(stop, self.scanned + self._BLOCK)
            found = self._key_in(buf, lo, hi)
            if found == _WAIT:
                return None  # the key's value lies past the buffer: this block again, with more
            if found is not None:
                return found
            self.scanned = hi
        return None

    def _key_in(self, buf: bytes, lo: int, hi: int) -> int | None:
        """The array's start when a top-level ``"traceEvents":`` key begins in ``buf[lo:hi]``;
        -1 when its value is not a list. Carries the scan state past ``hi``."""
        in_string, escaped, depth = self.state
        block = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=lo)
        depths, _, parity, end_string, end_escaped, end_depth = _scan_arrays(block, in_string, escaped, depth)
        at = buf.find(_KEY, lo, hi + len(_KEY) - 1)
        while 0 <= at < hi:
            i = at - lo
            before_depth, before_string = (depth, in_string) if i == 0 else (int(depths[i - 1]), bool(parity[i - 1]))
            if before_depth == 1 and not before_string:
                colon = _skip_blanks(buf, at + len(_KEY))
                value = _skip_blanks(buf, colon + 1)
                if value >= len(buf):
                    return _WAIT
                if buf[colon] == ord(":"):  # a key, not a value that happens to read "traceEvents"
                    return value + 1 if buf[value] == ord("[") else -1
            at = buf.find(_KEY, at + 1, hi + len(_KEY) - 1)
        self.state = (end_string, end_escaped, end_depth)
        return None


def _decode_batches(state: Decoding, store: bytearray, offset: int, on_events: OnEvents) -> int:
    """Decode the whole events at the start of the text ``store[1:]`` (``store[0]`` is a ``[``
    of :func:`bracketed`); return how many bytes of the text were consumed (0: no whole event
    yet, wait for more text). The text up to the last cut goes to ``on_events`` in pieces of
    about ``PIECE_BYTES`` (:func:`_decode_pieces`); what they leave (all of it when a piece
    fails) is decoded as one, as before."""
    if state.array_closed:
        return 0
    buf = memoryview(store)[1:]
    cut = last_candidate_cut(buf)
    if cut is None:
        if len(buf) <= MAX_EVENT_BYTES:
            return 0
        events, after_comma = _decode_exact(state, store, offset, None, -1)
        if events is None:
            return 0
        on_events(events)
        state.events_seen += len(events)
        return after_comma
    brace, after_comma = cut
    start = _decode_pieces(state, store, brace, on_events)
    with _bracketed_from(store, start) as rest:
        try:
            events = decode_cut(state, rest, after_comma - start)
        except msgspec.MsgspecError as exc:
            events, after_comma = _decode_exact(state, rest, offset + start, exc, brace - start)
            after_comma += start
    if events is None:
        return start
    on_events(events)
    state.events_seen += len(events)
    return after_comma


def _decode_pieces(state: Decoding, store: bytearray, brace: int, on_events: OnEvents) -> int:
    """Decode the text ``store[1:]`` before its last cut's ``brace`` in pieces of about
    ``PIECE_BYTES``, each ending at a candidate cut, each piece's events handed on before the
    next is decoded (its objects still in cache, and freed before the next is made); return
    the text offset where the undecoded rest begins (0: none decoded). The first piece that
    does not decode (a cut inside a string, or bad data) stops it: the rest is decoded as one
    by the caller, with its care (a true boundary found, the error reported)."""
    start = 0
    while brace - start > PIECE_BYTES + PIECE_BYTES // 2:
        cut = _CANDIDATE_CUT.search(store, 1 + start + PIECE_BYTES, 1 + brace)
        if cut is None:
            return start
        end = cut.end() - 1  # the cut's comma (store[end]), read as the piece's "]"
        with _bracketed_from(store, start) as piece:
            try:
                events = decode_cut(state, piece, end - start)
            except msgspec.MsgspecError:
                return start
        on_events(events)
        state.events_seen += len(events)
        start = end  # the text after the comma
    return start


@contextmanager
def _bracketed_from(store: bytearray, start: int) -> Iterator[bytearray | memoryview]:
    """The text from ``start`` (``store[start]``: the comma before it, or the ``[`` of
    :func:`bracketed` at 0) as an array's opening: that comma read as the "[" it needs while
    the caller decodes, put back after, so the buffer stays the file's text."""
    view = store if start == 0 else memoryview(store)[start:]
    view[0] = 0x5B  # "["
    try:
        yield view
    finally:
        if start:
            store[start] = 0x2C  # ","


def decode_cut(state: Decoding, store: bytearray, after_comma: int) -> list[Event]:
    """The events of the text ``store[1:]`` before the comma that ends at ``after_comma`` (an
    offset in the text): the comma (``store[after_comma]``) is read as the array's ``]`` for
    the decode, then put back. The same bytes as :func:`events_slice` up to that comma, with
    no copy."""
    store[after_comma] = 0x5D  # "]"
    try:
        return state.decode(EVENTS_DECODER, memoryview(store)[:after_comma + 1])
    finally:
        store[after_comma] = 0x2C  # ","


def last_candidate_cut(buf: bytes) -> tuple[int, int] | None:
    """(offset of the last "}" followed by a comma and "{", offset after that comma), or None."""
    window = 1 << 16
    while True:
        start = max(0, len(buf) - window)
        last = None
        for last in _CANDIDATE_CUT.finditer(buf, start):
            pass
        if last is not None:
            return last.start(), last.end()
        if start == 0:
            return None
        window *= 8


def events_slice(buf: bytes, brace: int) -> bytes:
    # One copy (a join of views), not four (slice, bytes(), and two concatenations).
    return b"".join((b"[", memoryview(buf)[:brace + 1], b"]"))


def _decode_exact(state: Decoding, store: bytearray, offset: int, error, brace: int):
    """After a failed cut: the true last event boundary (exact scan) tells a cut inside a string
    or a nested object (decode up to the true boundary, or wait for more text) from bad data."""
    def to_file(at: int) -> int:
        return offset + at - 1

    buf = memoryview(store)[1:]
    exact, closed = last_element_end(buf, len(buf))
    if closed:  # the events end in this buffer: the final decode takes the rest, metadata too
        state.array_closed = True
        return None, 0
    after = _COMMA_AFTER.match(buf, exact + 1) if exact is not None else None
    if exact is not None and exact != brace and after:
        try:
            return decode_cut(state, store, after.end()), after.end()
        except msgspec.MsgspecError as exc:
            error = exc
    elif exact is None or exact > brace:
        if len(buf) <= MAX_EVENT_BYTES:
            return None, 0  # the event goes on past the buffer: wait for more text
        where = f"$.traceEvents[{state.events_seen}]"
        raise TooLong(state.path, too_long(buf, 0, MAX_EVENT_BYTES, f"{where} (text with no event boundary)", where))
    if error is None:
        raise InputError(state.path, f"invalid JSON: no complete event in the {len(buf):,} bytes after byte "
                                     f"{offset:,} of the JSON text")
    raise state.error(error, to_file, state.events_seen) from None


def decode_final(state: Decoding, data: bytes, head: bytes, offset: int, on_events: OnEvents) -> TraceFile:
    def to_file(at: int) -> int:
        return at if at < len(head) else offset + at - len(head)

    try:
        doc = state.decode(TRACE_DECODER, data)
    except msgspec.MsgspecError as exc:
        raise state.error(exc, to_file, state.events_seen) from None
    if isinstance(doc, list):
        doc = TraceFile(traceEvents=doc)
    if doc.traceEvents is None:
        if state.events_seen:
            raise InputError(state.path, "invalid JSON: the traceEvents array is not closed")
        raise InputError(state.path, "not a Kineto trace: no traceEvents list")
    if doc.traceEvents:
        on_events(doc.traceEvents)
        state.events_seen += len(doc.traceEvents)
    doc.traceEvents = None
    return doc


def _skip_blanks(buf, at: int) -> int:
    while at < len(buf) and buf[at] in _WS:
        at += 1
    return at


# -- exact scanner: string-, escape- and depth-aware, vectorised, in bounded blocks ----------

def _scan_block(block: np.ndarray, in_string: bool, escaped: bool, depth: int):
    """Per-byte (outside-string structural depth after the byte, is-closing) for one block,
    and the state carried into the next block."""
    depths, closes, _, in_string, escaped, depth = _scan_arrays(block, in_string, escaped, depth)
    return depths, closes, in_string, escaped, depth


def _scan_arrays(block: np.ndarray, in_string: bool, escaped: bool, depth: int):
    """:func:`_scan_block`, with the per-byte inside-a-string parity (after the byte) too."""
    backslash = block == 92
    index = np.arange(len(block), dtype=np.int64)
    # Backslashes right before each byte: a quote after an odd run is escaped.
    last_plain = np.maximum.accumulate(np.where(backslash, -1 if not escaped else -2, index))
    run_before = np.empty(len(block), dtype=np.int64)
    run_before[0] = 1 if escaped else 0
    run_before[1:] = index[:-1] - last_plain[:-1]
    quote = (block == 34) & (run_before % 2 == 0)
    string_parity = (np.cumsum(quote, dtype=np.int64) + int(in_string)) % 2 == 1
    inside = string_parity | quote  # a quote byte itself is never structural
    opens = ((block == 123) | (block == 91)) & ~inside
    closes = ((block == 125) | (block == 93)) & ~inside
    depths = depth + np.cumsum(opens.astype(np.int64) - closes.astype(np.int64))
    trailing = len(block) - 1 - last_plain[-1] if len(block) else 0
    carried_escape = bool(trailing % 2) if len(block) else escaped
    return depths, closes, string_parity, bool(string_parity[-1]) if len(block) else in_string, carried_escape, \
        int(depths[-1]) if len(block) else depth


def scan_state(buf, start: int, stop: int) -> tuple[int, bool]:
    """(bracket depth, inside a string) at ``stop``, scanning from ``start`` (outside strings)."""
    in_string, _, depth = _scan_from(buf, start, stop, (False, False, 0))
    return depth, in_string


def _scan_from(buf, start: int, stop: int, state: tuple[bool, bool, int]) -> tuple[bool, bool, int]:
    """The scan state (inside a string, after a backslash, depth) at ``stop`` from ``state`` at ``start``."""
    in_string, escaped, depth = state
    for lo in range(start, stop, _SCAN_BLOCK):
        count = min(_SCAN_BLOCK, stop - lo)
        if _plain(buf, lo, count, escaped):
            continue
        block = np.frombuffer(buf, dtype=np.uint8, count=count, offset=lo)
        _, _, in_string, escaped, depth = _scan_block(block, in_string, escaped, depth)
    return in_string, escaped, depth


def _plain(buf, lo: int, count: int, escaped: bool) -> bool:
    """Does ``buf[lo:lo+count]`` hold no quote, bracket or backslash (nor follow a backslash)?
    Then the scan state passes it unchanged: a long run of blanks or of one string's letters
    costs six memchr, not the vectorised scan."""
    if escaped:
        return False
    block = memoryview(buf)[lo:lo + count].tobytes() if not isinstance(buf, bytes) else buf[lo:lo + count]
    return not any(c in block for c in (b'"', b"\\", b"{", b"}", b"[", b"]"))


def last_element_end(buf, stop: int) -> tuple[int | None, bool]:
    """(offset of the last byte closing a top-level element in ``buf[:stop]`` or None, whether
    the enclosing array closes in it); the buffer starts at an element boundary."""
    in_string, escaped, depth, last = False, False, 0, None
    for lo in range(0, stop, _SCAN_BLOCK):
        if _plain(buf, lo, min(_SCAN_BLOCK, stop - lo), escaped):
            continue  # no element ends in it, the state passes unchanged
        block = np.frombuffer(buf, dtype=np.uint8, count=min(_SCAN_BLOCK, stop - lo), offset=lo)
        depths, closes, in_string, escaped, depth = _scan_block(block, in_string, escaped, depth)
        below = np.flatnonzero(depths < 0)  # the enclosing array closed: nothing after counts
        limit = int(below[0]) if len(below) else len(block)
        ends = np.flatnonzero(closes[:limit] & (depths[:limit] == 0))
        if len(ends):
            last = lo + int(ends[-1])
        if len(below):
            return last, True
    return last, False
