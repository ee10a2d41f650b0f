"""analyzer.base.arrays: numpy's results, without numpy's optional modules (issue 13)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from analyzer.base import arrays


@pytest.mark.parametrize("values", [
    np.array([], dtype=np.int64), np.array([5], dtype=np.int32), np.array([3, 1, 3, -2, 1, 7], dtype=np.int64),
    np.array([True, False, True]), np.arange(1000, dtype=np.int8) % 7, np.array([2, 2, 2], dtype=np.uint16),
    [4, 1, 4], np.array([1.5, np.nan, 1.5, np.nan, 0.0]), np.array(["b", "a", "b"]), np.array([[2, 1], [1, 3]]),
    np.array([-100, 100, 0, -100], dtype=np.int8), np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64),
    np.array([2**62, 2**62 + 3, 2**62], dtype=np.int64), np.array([-(2**62), 2**62, 5], dtype=np.int64),
    np.random.default_rng(1).integers(-5000, 5000, 3000), np.random.default_rng(2).integers(0, 2**40, 3000),
])
def test_unique_is_np_unique(values):
    expected, got = np.unique(values), arrays.unique(values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_unique_leaves_numpy_ma_unimported():
    code = ("import sys, numpy as np; from analyzer.base import arrays; arrays.unique(np.array([3, 1, 3]));"
            "print('numpy.ma' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
