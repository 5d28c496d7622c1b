# SPDX-License-Identifier: MIT
"""The bucket and shard geometry of ShardedOptimizer: pure functions of the
item table, identical on every rank (no torch, no torch.distributed).

An *item* is one trainable tensor: an MXFP8Linear weight ("mx_both" or
"mx_row", by its planes), an NVFP4Linear weight ("nv_both" or "nv_row") or a
dense parameter ("dense", with its dtype).

Buckets. The items, in REVERSE model order (gradients become ready roughly
in reverse), are packed greedily into buckets of about `bucket_size`
elements: a bucket closes when adding the next item would exceed
`bucket_size`; an item larger than `bucket_size` gets a bucket of its own.

Inside a bucket the items are ordered by (kind: mx "both", then mx "row",
then nv "both", then nv "row", then dense grouped by dtype (float32,
bfloat16, float16); then the param-group index; then the reverse model
order). So these are each ONE contiguous segment of the bucket's flat index
space:

    row    [0, n_mx)        the row-plane bytes of every mx item
    col    [0, n_both)      the col-plane bytes of the "both" items
    nv     [lo, hi)         the NVFP4 items (lo even): row-plane byte of flat
                            index f is (f - lo) // 2 of the bucket's nv buffer
    nv_col [lo, hi)         the nv "both" items (a sub-range of nv)
    dense  [lo, hi) per dtype

A bucket may hold all three formats; each writeback sees only its own
segment. NVFP4 packs two elements per byte and rejects odd shard boundaries
(docs/contract.md 9.8), so NVFP4 items are placed at EVEN bucket offsets
(mxs_nvfp4_bucket_place: an item of odd numel is followed by one element of
gap, which belongs to no item: zero, like padding; its byte is the spare
nibble of the item's last byte), and a bucket holding NVFP4 items pads to a
multiple of 2*dp (see below). Buckets without NVFP4 items have no gaps.

Sharding. The bucket's n elements (item ends, gaps included) are padded to
n_pad = round_up(max(n, 1), dp * unit) with unit = align, or 2*align when
align is odd and the bucket holds NVFP4 items (mxs_nvfp4_bucket_elems: then
S is even, so every rank boundary inside an NVFP4 item is an even flat
index of it); rank r owns the flat range [r*S, (r+1)*S) with S = n_pad / dp.
Shard boundaries ignore item boundaries: a weight can be split between
ranks and a rank can own none of it (or only padding).

Offsets: an item at bucket offset `o` with `k` elements occupies flat
[o, o+k); element j of the item (row-major) is flat index o+j. Rank r holds
it at shard position o + j - r*S when that lies in [0, S). `item_shards`,
`locate` and `shard_to_items` map between the two (what a resharding
checkpoint needs).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

KINDS = ("mx_both", "mx_row", "nv_both", "nv_row", "dense")
MX_KINDS = ("mx_both", "mx_row")
NV_KINDS = ("nv_both", "nv_row")
DENSE_DTYPES = ("float32", "bfloat16", "float16")
_KIND_RANK = {k: i for i, k in enumerate(KINDS)}
_DTYPE_RANK = {d: i for i, d in enumerate(DENSE_DTYPES)}


@dataclass(frozen=True)
class ItemSpec:
    """One trainable tensor. `dtype` is the dense dtype name (one of
    DENSE_DTYPES), or a description such as "mxfp8:padded:ceil" /
    "nvfp4:1x16:padded" for mx / nv items; `group` its param-group index."""
    name: str
    kind: str
    shape: tuple
    dtype: str
    group: int = 0

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))


@dataclass(frozen=True)
class Placed:
    """An item inside a bucket: its index in the item table and flat offset."""
    item: int
    offset: int
    numel: int

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True)
class Bucket:
    index: int
    items: tuple            # Placed, in bucket order
    numel: int              # n: elements of the items
    n_pad: int              # padded to a multiple of dp*align
    shard: int              # S = n_pad / dp
    dp: int
    row: tuple              # (lo, hi): the mx items (row-plane bytes)
    col: tuple              # (lo, hi): the "both" items (col-plane bytes)
    dense: tuple            # ((dtype, lo, hi), ...) in DENSE_DTYPES order, non-empty only
    nv: tuple = (0, 0)      # (lo, hi): the NVFP4 items (lo even; gaps after odd-numel items)
    nv_col: tuple = (0, 0)  # (lo, hi): the nv "both" items

    @property
    def has_mx(self) -> bool:
        return self.row[1] > self.row[0]

    @property
    def has_col(self) -> bool:
        return self.col[1] > self.col[0]

    @property
    def has_nv(self) -> bool:
        return self.nv[1] > self.nv[0]

    @property
    def has_nv_col(self) -> bool:
        return self.nv_col[1] > self.nv_col[0]


@dataclass(frozen=True)
class Plan:
    items: tuple            # ItemSpec, model order
    buckets: tuple          # Bucket
    where: tuple            # per item: (bucket index, position in bucket.items)
    dp: int
    align: int
    bucket_size: int
    extra: tuple = field(default=())   # (key, value) pairs that enter the fingerprint


# ---- small pure helpers --------------------------------------------------------

def round_up(x: int, m: int) -> int:
    return -(-int(x) // int(m)) * int(m)


def intersect(lo: int, hi: int, a: int, b: int):
    """[lo, hi) ∩ [a, b) as (s, e) with e >= s (an empty result is (s, s))."""
    s, e = max(lo, a), min(hi, b)
    return (s, e) if e > s else (s, s)


def rank_range(bucket: Bucket, r: int):
    """Rank r's flat range [r*S, (r+1)*S) of the bucket."""
    if not 0 <= r < bucket.dp:
        raise ValueError(f"rank {r} outside a world of {bucket.dp}")
    return r * bucket.shard, (r + 1) * bucket.shard


def owner(bucket: Bucket, flat: int) -> int:
    """The rank owning flat index `flat` of the bucket."""
    if not 0 <= flat < bucket.n_pad:
        raise ValueError(f"flat index {flat} outside the bucket's {bucket.n_pad} elements")
    return flat // bucket.shard


def nvfp4_place(end: int) -> int:
    """The even offset the next NVFP4 item takes after flat index `end`
    (mxs_nvfp4_bucket_place)."""
    return int(end) + (int(end) & 1)


def nv_bytes(lo: int, hi: int) -> int:
    """Bytes of the packed row planes of the NVFP4 segment [lo, hi) (lo even):
    the item at offset o with k elements holds bytes [(o-lo)//2, (o-lo)//2 + ceil(k/2))."""
    return (int(hi) - int(lo) + 1) // 2


def pack(numels, bucket_size: int):
    """Greedy packing of items (numels in model order) in REVERSE model order:
    a list of buckets, each a list of item indices in reverse model order."""
    out, cur, size = [], [], 0
    for i in reversed(range(len(numels))):
        n = int(numels[i])
        if cur and size + n > bucket_size:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        out.append(cur)
    return out


def _order_key(spec: ItemSpec, rev_pos: int):
    return (_KIND_RANK[spec.kind], _DTYPE_RANK.get(spec.dtype, -1) if spec.kind == "dense" else -1,
            spec.group, rev_pos)


def check_item(spec: ItemSpec, i: int = 0) -> None:
    if spec.kind not in _KIND_RANK:
        raise ValueError(f"item {i} ({spec.name}): kind {spec.kind!r} is not one of {KINDS}")
    if spec.kind == "dense" and spec.dtype not in _DTYPE_RANK:
        raise ValueError(f"item {i} ({spec.name}): dense dtype {spec.dtype!r} is not one of {DENSE_DTYPES}")
    if spec.kind != "dense" and len(spec.shape) != 2:
        raise ValueError(f"item {i} ({spec.name}): an mx item is 2-D, got shape {spec.shape}")
    if any(int(d) < 0 for d in spec.shape) or spec.numel < 1:
        raise ValueError(f"item {i} ({spec.name}): shape {spec.shape} has no elements")
    if int(spec.group) < 0:
        raise ValueError(f"item {i} ({spec.name}): negative group index")


def make_plan(items, bucket_size: int, dp: int, align: int = 128, extra=()) -> Plan:
    """The whole geometry for a world of `dp` ranks (see the module doc)."""
    items = tuple(items)
    if not items:
        raise ValueError("no trainable items (an empty model)")
    for name, v, lo in (("bucket_size", bucket_size, 1), ("dp", dp, 1), ("align", align, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    for i, s in enumerate(items):
        check_item(s, i)
    where = [None] * len(items)
    buckets = []
    for b, idx in enumerate(pack([s.numel for s in items], bucket_size)):
        rev = {i: p for p, i in enumerate(idx)}
        order = sorted(idx, key=lambda i: _order_key(items[i], rev[i]))
        placed, off = [], 0
        for pos, i in enumerate(order):
            if items[i].kind in NV_KINDS:
                off = nvfp4_place(off)
            placed.append(Placed(i, off, items[i].numel))
            where[i] = (b, pos)
            off += items[i].numel
        n = off
        has_nv = any(items[i].kind in NV_KINDS for i in order)
        n_pad = round_up(max(n, 1), dp * (2 * align if has_nv and align % 2 else align))

        def span(pred):
            sel = [p for p in placed if pred(items[p.item])]
            return (sel[0].offset, sel[-1].end) if sel else (0, 0)

        row = span(lambda s: s.kind in MX_KINDS)
        col = span(lambda s: s.kind == "mx_both")
        nv = span(lambda s: s.kind in NV_KINDS)
        nv_col = span(lambda s: s.kind == "nv_both")
        dense = tuple((d,) + span(lambda s, d=d: s.kind == "dense" and s.dtype == d) for d in DENSE_DTYPES)
        dense = tuple(x for x in dense if x[2] > x[1])
        buckets.append(Bucket(b, tuple(placed), n, n_pad, n_pad // dp, dp, row, col, dense, nv, nv_col))
    return Plan(items, tuple(buckets), tuple(where), dp, align, bucket_size, tuple(extra))


# ---- per-rank views ------------------------------------------------------------

def item_shards(bucket: Bucket, r: int):
    """Every item of the bucket as rank r holds it: a list of
    (placed, start, length, shard_pos): elements [start, start+length) of the
    item are shard positions [shard_pos, shard_pos+length); length 0 when r
    owns none of it (then start = shard_pos = 0)."""
    lo, hi = rank_range(bucket, r)
    out = []
    for p in bucket.items:
        s, e = intersect(p.offset, p.end, lo, hi)
        out.append((p, s - p.offset, e - s, s - lo) if e > s else (p, 0, 0, 0))
    return out


def group_runs(plan: Plan, bucket: Bucket, r: int):
    """Rank r's owned item elements of the bucket as maximal runs of one
    param group: [(shard_lo, shard_hi, group), ...] in shard order (adjacent
    pieces of the same group merged; padding is in no run)."""
    runs = []
    for p, start, length, pos in item_shards(bucket, r):
        if length == 0:
            continue
        g = plan.items[p.item].group
        if runs and runs[-1][2] == g and runs[-1][1] == pos:
            runs[-1][1] = pos + length
        else:
            runs.append([pos, pos + length, g])
    return [tuple(x) for x in runs]


def segment_pieces(bucket: Bucket, lo: int, hi: int):
    """The flat segment [lo, hi) cut by rank: [(s, e) per rank] (absolute
    flat indices, possibly empty)."""
    return [intersect(lo, hi, *rank_range(bucket, r)) for r in range(bucket.dp)]


def locate(plan: Plan, item: int, elem: int):
    """Element `elem` of item `item` -> (bucket index, owning rank, shard position)."""
    if not 0 <= item < len(plan.items):
        raise ValueError(f"item {item} outside the {len(plan.items)} items")
    if not 0 <= elem < plan.items[item].numel:
        raise ValueError(f"element {elem} outside item {item} ({plan.items[item].numel} elements)")
    b, pos = plan.where[item]
    bucket = plan.buckets[b]
    flat = bucket.items[pos].offset + elem
    r = owner(bucket, flat)
    return b, r, flat - r * bucket.shard


def shard_to_items(plan: Plan, b: int, r: int):
    """Rank r's shard of bucket b as [(item index, item start, length, shard_pos)]
    for the items it owns part of (the inverse of `locate`)."""
    return [(p.item, s, n, pos) for p, s, n, pos in item_shards(plan.buckets[b], r) if n > 0]


# ---- fingerprint ---------------------------------------------------------------

def describe(plan: Plan):
    """The plan as a list of lines (what the fingerprint hashes; used to name
    the first difference between ranks)."""
    lines = [f"world={plan.dp} align={plan.align} bucket_size={plan.bucket_size} items={len(plan.items)}"]
    lines += [f"option {k}={v!r}" for k, v in plan.extra]
    lines += [f"item {i}: {s.name} {s.kind} {tuple(int(d) for d in s.shape)} {s.dtype} group={s.group}"
              for i, s in enumerate(plan.items)]
    return lines


def fingerprint(plan: Plan) -> int:
    """A 63-bit hash of `describe(plan)` (non-negative int64)."""
    h = hashlib.sha256("\n".join(describe(plan)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def first_difference(a, b):
    """The first differing line of two `describe` outputs, as a message."""
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "<missing>"
        y = b[i] if i < len(b) else "<missing>"
        if x != y:
            return f"{x!r} vs {y!r}"
    return None
