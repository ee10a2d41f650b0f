"""analyzer.base.arrays: numpy's results, without numpy's optional modules (issue 13)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from analyzer.base import arrays


VALUES = [
    np.array([], dtype=np.int64), np.array([5], dtype=np.int32), np.array([3, 1, 3, -2, 1, 7], dtype=np.int64),
    np.array([True, False, True]), np.arange(1000, dtype=np.int8) % 7, np.array([2, 2, 2], dtype=np.uint16),
    [4, 1, 4], np.array([1.5, np.nan, 1.5, np.nan, 0.0]), np.array(["b", "a", "b"]), np.array([[2, 1], [1, 3]]),
    np.array([-100, 100, 0, -100], dtype=np.int8), np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64),
    np.array([2**62, 2**62 + 3, 2**62], dtype=np.int64), np.array([-(2**62), 2**62, 5], dtype=np.int64),
    np.random.default_rng(1).integers(-5000, 5000, 3000), np.random.default_rng(2).integers(0, 2**40, 3000),
]


@pytest.mark.parametrize("values", VALUES)
def test_unique_is_np_unique(values):
    expected, got = np.unique(values), arrays.unique(values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_unique_leaves_numpy_ma_unimported():
    code = ("import sys, numpy as np; from analyzer.base import arrays; arrays.unique(np.array([3, 1, 3]));"
            "print('numpy.ma' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


FLAGS = [(False, False, False), (True, False, False), (False, True, False), (False, False, True), (True, True, True),
         (True, True, False), (False, True, True)]


def _same_as_np_unique(values, flags):
    expected, got = np.unique(values, *flags), arrays.unique_ints(values, *flags)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("values", VALUES)
def test_unique_ints_is_np_unique(values, flags):
    """Every output np.unique gives (index, inverse, counts), the same arrays and dtypes: the job
    analyses use it in place of np.unique (issue 42); narrow ranges by counts, others np.unique."""
    _same_as_np_unique(values, flags)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60) | st.lists(st.integers(-3, 40), max_size=300),
       st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.uint64]), st.sampled_from(FLAGS))
def test_unique_ints_fuzz(values, dtype, flags):
    info = np.iinfo(dtype)
    _same_as_np_unique(np.array([v for v in values if info.min <= v <= info.max], dtype=dtype), flags)
