"""The streaming decoders stay correct whatever holds their frames (issue 13).

Dask's workers sample every thread's stack for their profiler; a sampled frame keeps its locals
alive after the function returns, so a view of a buffer (``np.frombuffer``, a memoryview) can
outlive its line. A decoder that then resized that buffer in place raised ``BufferError:
Existing exports of data: object cannot be re-sized``. Here a profile hook keeps every frame of
the ingest modules alive, deterministically, and the decode must still give the same columns.
"""

from __future__ import annotations

import gzip
import sys

import numpy as np
import pytest

from analyzer.ingest import parallel, stream
from analyzer.ingest.classify import KernelClassifier
from analyzer.ingest.columns import ColumnBuilder
from analyzer.ingest.files import iter_trace_chunks
from analyzer.ingest.loader import load_rank_trace, rank_trace_of
from builders import two_step_ddp
from trace_compare import assert_same, resolved


class FrameHoarder:
    """A profile hook that keeps every frame of the given modules (and so their locals)."""

    def __init__(self, *modules) -> None:
        self.files = {module.__file__ for module in modules}
        self.frames = []

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename in self.files:
            self.frames.append(frame)

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)

    def held_views(self) -> int:
        """numpy arrays viewing another object's buffer, kept alive by the held frames."""
        return sum(isinstance(value, np.ndarray) and value.base is not None and not isinstance(value.base, np.ndarray)
                   for frame in self.frames for value in frame.f_locals.values())


@pytest.fixture
def trace_files(tmp_path):
    plain = two_step_ddp(rank=0, world_size=2, pg_ranks=range(2)).write(tmp_path / "rank-0.json")
    packed = tmp_path / "rank-0.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    return plain, packed


def load(path, chunk_bytes: int):
    builder = ColumnBuilder(KernelClassifier())
    meta, decoding = stream.decode_stream(path, iter_trace_chunks(path, chunk_bytes=chunk_bytes), builder.add)
    return resolved(rank_trace_of(path, meta, builder, decoding))


@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 20])
def test_decode_with_every_frame_held(trace_files, chunk_bytes):
    for path in trace_files:
        expected = load(path, chunk_bytes)
        with FrameHoarder(stream) as hoarder:
            held = load(path, chunk_bytes)
        assert hoarder.held_views() > 0  # the hook really kept views of the buffers alive
        assert_same(held, expected)


def test_two_core_decode_with_every_frame_held(trace_files):
    """The two-core loader's gzip path (slices cut from the inflated stream) too."""
    packed = trace_files[1]
    expected = resolved(load_rank_trace(packed))
    with FrameHoarder(stream, parallel) as hoarder:
        held = resolved(parallel.load_rank_trace_parallel(packed, chunk_bytes=512))
    assert hoarder.held_views() > 0
    assert_same(held, expected)
