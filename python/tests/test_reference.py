# SPDX-License-Identifier: MIT
"""The numpy reference against the oracle vectors (NVIDIA's own host
conversions): the reference the other tests trust is itself checked."""
import os

import numpy as np
import pytest

import reference as ref
from conftest import VECTORS


def _load(name, ncols):
    path = os.path.join(VECTORS, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} absent")
    rows = [l.split() for l in open(path) if l.strip() and not l.startswith("#")]
    return [np.array([int(r[i], 16) for r in rows], dtype=np.uint64) for i in range(ncols)]


def test_e4m3_from_f32_matches_oracle():
    bits, q = _load("e4m3_from_f32.txt", 2)
    x = bits.astype(np.uint32).view(np.float32)
    got = ref.e4m3_from_f32(x)
    bad = np.nonzero(got != q.astype(np.uint8))[0]
    assert bad.size == 0, f"{bad.size} mismatches, first f32 0x{int(bits[bad[0]]):08x}"


def test_e8m0_matches_oracle():
    bits, up, down = _load("e8m0_from_f32.txt", 3)
    x = bits.astype(np.uint32).view(np.float32)
    assert np.array_equal(ref.e8m0_up(x), up.astype(np.uint8))
    assert np.array_equal(ref.e8m0_down(x), down.astype(np.uint8))


def test_e4m3_to_f32_matches_oracle():
    q, bits = _load("e4m3_to_f32.txt", 2)
    got = ref.e4m3_to_f32(q.astype(np.uint8))
    want = bits.astype(np.uint32).view(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
