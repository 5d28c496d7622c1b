# SPDX-License-Identifier: MIT
"""The low-level API against what a caller may do to a weight's buffers after building it (numpy,
host library): buffers reassigned to arrays of another size are checked at every call, before
anything is written; a bucket keeps the arrays it was built over alive; read-only buffers may be
read; a source of another 2-D shape and a shard start that is not an int are refused."""
import gc

import numpy as np
import pytest

import mxshard

POISON = 0xA5


def arena(n, used):
    """A poisoned arena and a view of its first `used` bytes."""
    a = np.full(n, POISON, np.uint8)
    return a, a[:used]


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_buffer_reassigned_too_small_is_refused_before_any_write(fmt):
    """w.row_data set, after the weight was built, to a 16-byte slice of a larger poisoned arena:
    quantize and a bucket writeback wrote thousands of bytes past its end; they raise now, naming
    the buffer and the bytes it needs, and no byte of the arena moved."""
    R, C = 64, 64
    src = np.random.default_rng(0).standard_normal((R, C)).astype(np.float32)
    for call in ("quantize", "writeback"):
        if fmt == "mxfp8":
            w = mxshard.MXFP8Weight.empty(R, C, planes="row")
        else:
            w = mxshard.NVFP4Weight.empty(R, C, planes="row")
        big, small = arena(8192, 16)
        w.row_data = small
        with pytest.raises(ValueError, match=r"^row_data: 16 bytes, a (packed )?64x64 "):
            if call == "quantize":
                (mxshard.quantize if fmt == "mxfp8" else mxshard.quantize_nvfp4)(w, src)
            else:
                cls = mxshard.BucketWriteback if fmt == "mxfp8" else mxshard.NVFP4BucketWriteback
                cls([(w, src.reshape(-1).copy(), 0)]).run()
        assert (big == POISON).all(), f"{call} wrote into the arena"


def test_a_bucket_keeps_the_buffers_it_was_built_over():
    """The weight's buffers reassigned after an NVFP4 bucket was built, and the old ones dropped:
    the bucket holds them (it kept only the weight, and run() wrote into freed memory: a crash);
    run() writes them, the new arrays stay untouched."""
    R, C = 64, 96
    src = np.random.default_rng(1).standard_normal(R * C).astype(np.float32)
    for cls, make in ((mxshard.NVFP4BucketWriteback, lambda: mxshard.NVFP4Weight.empty(R, C, planes="row")),
                      (mxshard.BucketWriteback, lambda: mxshard.MXFP8Weight.empty(R, C, planes="row"))):
        w = make()
        wb = cls([(w, src.copy(), 0)])
        fresh = {k: np.full_like(getattr(w, k), 7) for k in ("row_data", "row_scale") + (("amax",) if
                                                                                      hasattr(w, "amax") else ())}
        for k, v in fresh.items():
            setattr(w, k, v)
        gc.collect()
        junk = [np.full(R * C, 3, np.uint8) for _ in range(8)]   # (reuse of freed memory, if any)
        wb.run()
        assert all((v == 7).all() for v in fresh.values()) and junk


def test_read_only_buffers_may_be_dequantized():
    """dequantize of an MXFP8 weight whose buffers are read-only (a memory-mapped file) only reads
    them: it raised "the array is read-only" (NVFP4's accepted them)."""
    src = np.random.default_rng(2).standard_normal((40, 70)).astype(np.float32)
    w = mxshard.quantize(mxshard.MXFP8Weight.empty(40, 70, planes="both"), src)
    want = mxshard.dequantize(w, "col", dtype="f32")
    for k in ("row_data", "row_scale", "col_data", "col_scale"):
        getattr(w, k).setflags(write=False)
    assert np.array_equal(mxshard.dequantize(w, "col", dtype="f32"), want)


def test_a_source_of_another_shape_or_a_fractional_start_is_refused():
    """quantize of a 70x40 source into a 40x70 weight (the same count: it quantized the bytes as
    if they were 40x70) and a shard start of 2.9 (truncated to 2) raise, nothing written."""
    src = np.random.default_rng(3).standard_normal((70, 40)).astype(np.float32)
    w = mxshard.MXFP8Weight.empty(40, 70, planes="row")
    w.row_data[:] = POISON
    with pytest.raises(ValueError, match=r"^src: give a 40x70 \(or flat\) source"):
        mxshard.quantize(w, src)
    assert (w.row_data == POISON).all()
    mxshard.quantize(w, src.reshape(-1))   # (flat: the row-major values, as documented)
    with pytest.raises(TypeError, match=r"^item 0: give the shard's start as an int"):
        mxshard.BucketWriteback([(w, np.ones(10, np.float32), 2.9)])


def test_nvfp4_shape_helpers_refuse_int64_overflow():
    """nvfp4_data_shape / nvfp4_fragment_bytes are 64-bit index math like the library's: beyond int64
    they raised nothing and returned 128-bit numbers (NVFP4Weight.empty: numpy's "array is too
    big"); a negative start gave a size. Now SizeOverflowError / ValueError."""
    big = 2 ** 63 - 1
    with pytest.raises(mxshard.SizeOverflowError):
        mxshard.nvfp4_data_shape(big, big, "col")
    with pytest.raises(mxshard.SizeOverflowError):
        mxshard.nvfp4_fragment_bytes(big - 1, big - 1)
    with pytest.raises(mxshard.SizeOverflowError):
        mxshard.NVFP4Weight.empty(2 ** 40, 2 ** 40)
    with pytest.raises(ValueError, match=r"^nvfp4_fragment_bytes: give start as an int >= 0"):
        mxshard.nvfp4_fragment_bytes(-5, 3)
    assert mxshard.nvfp4_fragment_bytes(3, 5) == 3 and mxshard.nvfp4_data_shape(3, 5, "row") == (8,)
