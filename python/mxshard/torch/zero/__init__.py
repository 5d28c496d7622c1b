# SPDX-License-Identifier: MIT
"""ShardedOptimizer: ZeRO-1 / Megatron-style sharded masters, replicated weights, over the same
converted model and FSDP2's pieces (fsdp.units.WeightUnit, fsdp.gathered.GatheredWeight).

    optim.py          ShardedOptimizer (the torch.optim.Optimizer face, construction, the step);
                      state.py: its state dict in DCP's form;  compat.py: what torch.optim habits meet
    items.py          the items and the pure bucket geometry (FSDP2's dim-0 chunks, rank-major)
    grads.py          the gradient path (hooks, reductions, zeroing);  held_grad.py: a .grad's placeholder
    refresh.py        the writeback: WeightUnits, ONE MAX reduction, one all_gather per bucket
    comm.py           its group's collectives (through mxshard.collectives)
"""
