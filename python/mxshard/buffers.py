# SPDX-License-Identifier: MIT
"""BucketBuffers: a bucket's primaries in one contiguous buffer per plane,
as Megatron-LM's parameter buffers hold them, and the even sharding of the
bucket's flat master buffer across data-parallel ranks."""
from __future__ import annotations

from . import _arrays as A
from . import _lib as L
from ._plumbing import zeros as _zeros
from .weight import MXFP8Weight


class BucketBuffers:
    """Allocates, for weights of the given shapes and planes, ONE data buffer
    per present plane (the weights' data planes are consecutive views of it,
    in order) and one scale buffer per present plane.

    shapes: [(rows, cols), ...]; planes: one 'row'/'col'/'both' for all, or
    one per weight; layout: scale layout of every weight; device: None
    (numpy) or a torch device.

    The flat master layout is every weight's elements in order: weight i
    occupies [offsets[i], offsets[i] + rows*cols) of a `numel`-element master
    buffer. shard_items() cuts that buffer into a rank's contiguous range."""

    def __init__(self, shapes, planes="row", layout="padded", device=None):
        shapes = [A.check_shape(r, c) for r, c in shapes]
        if isinstance(planes, (str, int)):
            planes = [planes] * len(shapes)
        if len(planes) != len(shapes):
            raise ValueError("BucketBuffers: one planes entry per shape")
        self.dirs = [A.dirs_code(p) for p in planes]
        self.shapes = shapes
        self.layout = A.layout_code(layout)
        self.offsets, n = [], 0
        for r, c in shapes:
            self.offsets.append(n)
            n += r * c
        self.numel = n
        self.data, self.scales = {}, {}
        for plane, pn in ((L.ROWWISE, "row"), (L.COLWISE, "col")):
            idx = [i for i, d in enumerate(self.dirs) if d & plane]
            if not idx:
                self.data[pn] = self.scales[pn] = None
                continue
            nd = sum(shapes[i][0] * shapes[i][1] for i in idx)
            ns = sum(_prod(A.scale_shape(*shapes[i], plane, self.layout)) for i in idx)
            self.data[pn] = _zeros((nd,), device)
            self.scales[pn] = _zeros((ns,), device)
        pos = {"row": [0, 0], "col": [0, 0]}
        self.weights = []
        for i, (r, c) in enumerate(shapes):
            kw = {}
            for plane, pn in ((L.ROWWISE, "row"), (L.COLWISE, "col")):
                if not self.dirs[i] & plane:
                    continue
                d0, s0 = pos[pn]
                sshape = A.scale_shape(r, c, plane, self.layout)
                ns = _prod(sshape)
                kw[f"{pn}_data"] = self.data[pn][d0:d0 + r * c].reshape(r, c)
                kw[f"{pn}_scale"] = self.scales[pn][s0:s0 + ns].reshape(sshape)
                pos[pn] = [d0 + r * c, s0 + ns]
            self.weights.append(MXFP8Weight(r, c, layout=self.layout, **kw))

    @staticmethod
    def shard_range(numel, world, rank):
        """Rank `rank`'s even share [lo, hi) of `numel` elements (the last
        ranks may get less, as with a buffer padded to a multiple of world)."""
        per = -(-numel // world)
        lo = min(rank * per, numel)
        return lo, min(lo + per, numel)

    def shard_items(self, master_shard, lo, hi):
        """Writeback items for a rank whose master shard holds flat elements
        [lo, hi) of the bucket (`master_shard` has hi - lo elements). Every
        weight gets an item, with length 0 where the rank owns none of it."""
        items = []
        for i, w in enumerate(self.weights):
            a, b = self.offsets[i], self.offsets[i] + w.rows * w.cols
            s, e = max(a, lo), min(b, hi)
            if e <= s:
                items.append((w, master_shard[0:0], 0, 0))
            else:
                items.append((w, master_shard[s - lo:e - lo], s - a, e - s))
        return items


def _prod(shape):
    n = 1
    for v in shape:
        n *= v
    return n
