# SPDX-License-Identifier: MIT
"""Checks of a converted linear shared by the one-process tests and the multi-rank cases
(imported where torch is installed)."""
import torch
from torch import nn

import mxshard.torch as mxt


def bytes_fresh(lin):
    """The converted linear's bytes are the whole-tensor quantize of its master now (those of a
    fresh conversion of the same values)."""
    twin = nn.Linear(lin.in_features, lin.out_features, bias=False)
    with torch.no_grad():
        twin.weight.copy_(lin.weight.detach()._data)
    twin = mxt.convert(twin, lin.planes, format=lin.format)
    return torch.equal(mxt.dequantized_weight(lin), mxt.dequantized_weight(twin))
