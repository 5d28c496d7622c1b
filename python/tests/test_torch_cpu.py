# SPDX-License-Identifier: MIT
"""CPU torch tensors take the host library and give the numpy path's bytes;
torch dtypes (bfloat16, float8_e4m3fn views) work. Skips without torch."""
import numpy as np
import pytest

import mxshard
from conftest import torch_or_skip


@pytest.mark.parametrize("shape", [(1, 1), (40, 70), (65, 97)])
@pytest.mark.parametrize("planes", ["row", "col", "both"])
@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
def test_cpu_tensors_equal_numpy(shape, planes, layout):
    torch = torch_or_skip()
    g = torch.Generator().manual_seed(hash((shape, planes, layout)) % 1000)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(shape, generator=g).to(dt)
        wt = mxshard.MXFP8Weight.empty(*shape, planes=planes, layout=layout, device="cpu")
        mxshard.quantize(wt, x)
        wn = mxshard.MXFP8Weight.empty(*shape, planes=planes, layout=layout)
        xn = x.view(torch.int16).numpy().view(np.uint16) if dt == torch.bfloat16 else x.numpy()
        mxshard.quantize(wn, xn, src_dtype="bf16" if dt == torch.bfloat16 else None)
        for pn in ("row", "col"):
            a, b = getattr(wt, f"{pn}_data"), getattr(wn, f"{pn}_data")
            assert (a is None) == (b is None)
            if a is None:
                continue
            assert np.array_equal(a.numpy(), b)
            assert np.array_equal(getattr(wt, f"{pn}_scale").numpy(), getattr(wn, f"{pn}_scale"))
            assert wt.fp8_view(pn).dtype == torch.float8_e4m3fn
            d = wt.dequantize(plane=pn, dtype="bf16")
            assert d.dtype == torch.bfloat16 and d.shape == shape
            dn = wn.dequantize(plane=pn, dtype="f32")
            assert np.array_equal(wt.dequantize(plane=pn, dtype="f32").numpy().view(np.uint32),
                                  dn.view(np.uint32))


def test_fp8_view_matches_torch_decode():
    torch = torch_or_skip()
    x = torch.randn(64, 64)
    w = mxshard.MXFP8Weight.empty(64, 64, planes="row", layout="compact", device="cpu").quantize_(x)
    scales = torch.exp2(w.row_scale.to(torch.float32) - 127)  # [64, 2]
    deq = w.row_data_fp8.to(torch.float32) * scales.repeat_interleave(32, dim=1)
    assert torch.equal(deq, w.dequantize(dtype="f32"))


def test_cpu_tensor_rejections():
    torch = torch_or_skip()
    w = mxshard.MXFP8Weight.empty(40, 70, planes="row", device="cpu")
    with pytest.raises(ValueError):
        mxshard.quantize(w, torch.ones(40, 70, dtype=torch.float64))
    with pytest.raises(ValueError):
        mxshard.quantize(w, torch.ones(70, 40).t())
    mxshard.quantize(w, np.ones((40, 70), np.float32))  # a numpy source into CPU tensors: both host memory
    with pytest.raises(ValueError):
        mxshard.quantize(w, torch.ones(40, 70, requires_grad=True) * 2)
