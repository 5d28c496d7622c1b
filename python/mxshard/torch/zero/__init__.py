# SPDX-License-Identifier: MIT
"""ShardedOptimizer: ZeRO-1 / Megatron-style sharded masters, replicated primaries.

    optim.py          ShardedOptimizer (the torch.optim.Optimizer face, the step)
    build.py          its construction (items, buckets, views, hooks);  adopt.py: convert()'s linears
                      become its storage;  compat.py: what torch.optim habits meet
    grads.py          the gradient path (hooks, reductions, zeroing);  held_grad.py: a dense .grad's placeholder
    writeback.py      the writeback of the primaries and dense parameters after the inner step
    layout.py         the pure bucket geometry;  comm.py: its group's collectives (mxshard.collectives)
    linear.py, nvfp4_linear.py, byte_buffers.py
                      MXFP8Linear / NVFP4Linear: the linears whose planes are the optimizer's buffers
"""
