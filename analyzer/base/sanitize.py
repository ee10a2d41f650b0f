"""One sanitiser for every text sink (issue 41): trace content (a device, host or group name, a
file name, an NCCL version) is untrusted and must not drive a terminal or a CI page.

- :func:`shown`: a file name's bytes that are not UTF-8 (Python's surrogate escapes) as ``\\xff``,
  so JSON, HTML and any UTF-8 file can hold it; nothing else changes.
- :func:`terminal`: :func:`shown`, and every control character but newline and tab (C0, DEL, C1:
  ESC starts CSI and OSC sequences: colours, window titles, OSC 52 clipboard writes) and every
  bidirectional override as its escape (``\\x1b``, ``\\u202e``): shown, never obeyed. For stdout,
  stderr and text files.
- :func:`one_line`: :func:`terminal`, newlines and carriage returns escaped too (an error line).
- :func:`markdown`: :func:`one_line`, and every Markdown metacharacter (backticks included:
  they close a code span) backslash-escaped, ``<``/``>``/``&`` as entities: a GitHub job
  summary shows the text and renders no link, image or HTML from it.
"""

from __future__ import annotations

import re

# C0 but \t and \n, DEL, C1; the bidi embeddings/overrides/isolates; lone surrogates (undecodable bytes).
_TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~])")
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def _escape(match: re.Match) -> str:
    char = match.group(0)
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the undecodable byte itself
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with undecodable bytes (surrogate escapes) shown as ``\\xNN``."""
    return _SURROGATE.sub(_escape, text) if _SURROGATE.search(text) else text


def terminal(text: str) -> str:
    """``text`` safe for a terminal: control characters and bidi overrides escaped, newline and tab kept."""
    return _TERMINAL.sub(_escape, text) if _TERMINAL.search(text) else text


def one_line(text: str) -> str:
    """``text`` as one safe line: :func:`terminal`, newlines escaped too."""
    return _ONE_LINE.sub(_escape, text) if _ONE_LINE.search(text) else text


def markdown(text: str) -> str:
    """``text`` shown literally in GitHub-flavoured Markdown (a table cell or a line)."""
    escaped = _MARKDOWN.sub(r"\\\1", one_line(str(text)))
    return re.sub("[<>&]", lambda m: _ENTITIES[m.group(0)], escaped)


# The bidi controls in UTF-8 (E2 80 AA-AE, E2 81 A6-A9) and the C0/DEL bytes but \t \n \r.
_TERMINAL_BYTES = re.compile(b"\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def terminal_bytes(data: bytes) -> bytes:
    """:func:`terminal` of UTF-8 text already encoded (a JSON document's pieces: its control
    characters are escapes already; a bidi control inside a string becomes ``\\u202e``, the
    same character to a JSON reader)."""
    if not _TERMINAL_BYTES.search(data):
        return data
    return _TERMINAL_BYTES.sub(lambda m: _escape(re.match(".", m.group(0).decode("utf-8", "surrogateescape"),
                                                          re.S)).encode("ascii"), data)
