# SPDX-License-Identifier: MIT
"""The converted linear as FSDP2 (and every other loop) sees it.

    linear.py    MXFP8ParamLinear / NVFP4ParamLinear: nn.Linear whose weight is a QuantMaster Parameter
    master.py    QuantMaster (the master as a tensor subclass: FSDP2's all-gather extension), QuantSpec
    gathered.py  GatheredWeight: the unsharded weight between FSDP2's all-gather and its reshard
    group.py     FSDPGroup: every converted weight of a model, its ONE refresh collective per step
    units.py     WeightUnit: one weight's bytes on this rank (the library's writeback, fragments, send / assemble)
"""
