# SPDX-License-Identifier: MIT
"""A format is a value: MXFP8 and NVFP4, each one object that owns its weight
class, its whole-tensor operations, its bucket writeback and the geometry of
its planes. Callers ask the object; nobody compares format strings.

    fmt = mxshard.formats.get("nvfp4")       # a saved name -> the value (a Format passes through)
    w = fmt.empty(4096, 4096, planes="both", device="cuda")
    fmt.quantize(w, bf16_weight)
    fmt.block_height("col")                   # 16 (MXFP8: 32)
    fmt.name                                  # "nvfp4": what checkpoints, fingerprints and options say

                     MXFP8                            NVFP4
    element          E4M3, one byte                   E2M1, two per byte (even index low nibble)
    block            1x32 (column plane: 32x1)        1x16 (column plane: 16x1) or 16x16 tiles
    scale            E8M0, rounding ceil | floor      E4M3 (nearest), times one fp32 tensor amax
    column plane     [rows, cols], not transposed     transposed: [cols, rows/2] packed
    compact scales   row [rows, ceil(cols/32)]        row [rows, ceil(cols/16)]
                     col [ceil(rows/32), cols]        col [cols, ceil(rows/16)] (transposed)
    packed entries   1 byte per block (exponent)      2 or 4 bytes per block (amax), + the tensor amax
    weight           MXFP8Weight (weight.py)          NVFP4Weight (nvfp4.py)
    operations       ops.py                           nvfp4.py
    writeback        BucketWriteback (writeback.py)   NVFP4BucketWriteback (nvfp4_writeback.py)

The values are immutable, equal by name, hashable and pickle as a lookup of
their name (an unpickled value is the very object). Their geometry methods
are small pure functions of integers; scale-plane shapes and where a block's
packed entry sits come from the C library (mxs_scale_shape,
mxs_nvfp4_scale_shape, mxs_wb_region_make, mxs_nvfp4_wb_region_make), the
byte counts of a whole plane through the weight classes.

This module sits above both formats' modules (it imports them; none of them
imports it) and below mxshard.torch.
"""
from __future__ import annotations

import math

from . import _arrays as A
from . import _lib as L
from . import fsdp_geometry as G
from . import nvfp4 as _nv
from . import ops as _mx
from ._plumbing import zeros as _zeros
from .nvfp4_writeback import NVFP4BucketWriteback
from .weight import MXFP8Weight
from .writeback import BucketWriteback

__all__ = ["Format", "MXFP8", "NVFP4", "ALL", "NAMES", "get", "of"]


class Format:
    """One block format (MXFP8 or NVFP4; see the module doc). Its data are class attributes of
    its subclass; the methods are the format's rules. Use the values MXFP8 and NVFP4."""

    __slots__ = ()

    name = None             # "mxfp8" | "nvfp4": the serialized name (checkpoints, fingerprints, options)
    weight_class = None     # MXFP8Weight | NVFP4Weight
    writeback_class = None  # BucketWriteback | NVFP4BucketWriteback
    block_elems = None      # elements per scale block along a row: 32 | 16
    blocks = ()             # the block shapes it has; blocks[0] is the default
    roundings = ()          # its scale roundings; roundings[0] is the default
    option = None           # the option only this format takes: "rounding" (MXFP8) | "block" (NVFP4)
    option_choices = ()     # its values (roundings | blocks); the first is the default
    fixed_note = ""         # why the other format's option does not apply to this one
    has_amax = False        # a per-tensor fp32 amax beside the block scales (NVFP4)
    packed = False          # two elements per byte (NVFP4's E2M1): a row of odd length starts inside a byte
    buffers = ()            # the weight's buffer names (a module's state_dict entries)
    codes = {}              # "data" | "scale" -> the encoding of those bytes
    e4m3_buffers = ()       # the buffers that hold E4M3 bytes

    # -- identity: immutable, equal by name, pickled as a lookup of the name

    def __setattr__(self, name, value):
        raise AttributeError(f"mxshard.formats.{self.name.upper()} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"mxshard.formats.{self.name.upper()} is immutable")

    def __eq__(self, other):
        return isinstance(other, Format) and other.name == self.name

    def __hash__(self):
        return hash(("mxshard.Format", self.name))

    def __reduce__(self):
        return get, (self.name,)

    def __repr__(self):
        return f"mxshard.formats.{self.name.upper()}"

    @property
    def default_block(self):
        return self.blocks[0]

    @property
    def default_rounding(self):
        return self.roundings[0]

    def spec_options(self, rounding=None, block=None):
        """(rounding, block) of a weight of this format: its own option (None: the default), the
        other one fixed (MXFP8: block '1x32'; NVFP4: rounding 'nearest')."""
        return (self.default_rounding if rounding is None else rounding,
                self.default_block if block is None else block)

    # -- geometry (pure functions of integers)

    def block_height(self, plane, block=None):
        """Rows one block of `plane` ('row' | 'col') spans: 1 for a row plane, the block length
        for a column plane, 16 for either plane of NVFP4's 16x16 tiles."""
        return 1 if plane == G.PLANE_ROW else self.block_elems

    def scale_height(self, plane):
        """Rows of the weight per index of a COMPACT scale plane's first window axis: the row plane
        (and 16x16 tiles, stored per row) indexes rows, a column plane blocks of block_elems rows."""
        return 1 if plane == G.PLANE_ROW else self.block_elems

    def transposed(self, plane):
        """Whether `plane` is stored transposed, data and scales (NVFP4's column plane: data
        [cols, rows/2] packed, a GEMM reads it as P = W^T; FSDP2 gathers it as a row-major stage)."""
        return False

    def scales_transposed(self, plane):
        """Whether the COMPACT scale plane of `plane` holds the weight's rows along its second axis
        (NVFP4's column plane, [cols, ceil(rows/16)]): a window of rows is then a column range."""
        return self.transposed(plane)

    def scale_shape(self, rows, cols, plane, layout):
        """The 2-D shape of a scale plane in `layout` ('compact', 'padded', 'swizzled')."""
        raise NotImplementedError

    def window_unit(self, rows, cols, plane):
        """Bytes of the COMPACT scale plane per index of its window axis (scale_height's)."""
        m, k = self.scale_shape(rows, cols, plane, "compact")
        return m if self.scales_transposed(plane) else k

    def data_shape(self, rows, cols, plane):
        """The shape a data plane is allocated with."""
        raise NotImplementedError

    def plane_bytes(self, rows, cols):
        """Bytes of one whole data plane (a packed plane for NVFP4)."""
        raise NotImplementedError

    def fragment_bytes(self, start, length):
        """Bytes of the fragment of a shard [start, start+length) of a data plane."""
        raise NotImplementedError

    def regions(self, rows, cols, planes="row", block=None):
        """The weight's packed regions of a bucket writeback, in the order the C plan lays them
        out: [(region, block height, block rows, entries per block row, row step, column step)],
        from the C library (mxs_wb_region_make, mxs_nvfp4_wb_region_make). Block j of block row b
        sits at the region's slot offset + b*row_step + j*col_step (contract 4.2 and 9.8; the slot
        offsets are the plan's, slot_offsets)."""
        raise NotImplementedError

    def amax_entries(self, world):
        """Packed entries beside the blocks that every rank writes (NVFP4's tensor amax when
        sharded over several ranks)."""
        return 0

    def data_send_shape(self, rows, cols, world):
        """FSDP2: the data input of one all-gather of a [rows, cols] weight over `world` ranks:
        [S, cols] bytes with S = ceil(rows/world) (FSDP2's padded shard)."""
        return (G.chunk_rows(rows, world), cols)

    def scratch_bytes(self, rows, cols, planes, layout):
        """FSDP2: bytes of the per-weight scratch that assembles a gathered plane: the largest
        plane's scales in `layout` (NVFP4: and room for a compacted or transposed data plane)."""
        return max(math.prod(self.scale_shape(rows, cols, p, layout)) for p in _planes(planes))

    def check_shards(self, rows, cols, world, name):
        """Raises NotImplementedError (the same on every rank) when the library's writeback cannot
        serve FSDP2's dim-0 shards of this weight; MXFP8 serves every sharding."""

    def send_sources(self, planes, block=None):
        """FSDP2: the data planes a rank sends (a fragment each): 'row', and 'col' for "both"."""
        return _planes(planes)

    # -- the packed buffer of a writeback

    def entry_view(self, wb):
        """The writeback's packed buffer as its entries (a torch tensor)."""
        return wb.packed

    def clear_status(self, wb):
        """Writes a clear group status into the packed buffer (before apply)."""
        wb.packed[wb.status_offset] = 0

    def slot_offsets(self, wb, world):
        """({region: the entry index where it starts}, the tensor amax's entry index or None) of
        the single item of `wb` (the C plan's slots)."""
        raise NotImplementedError

    # -- objects

    def weight(self, rows, cols, *, layout="padded", block=None, amax=None, **planes):
        """A weight of this format over the given buffers (row_data, row_scale, col_data,
        col_scale; NVFP4 also amax)."""
        raise NotImplementedError

    def empty(self, rows, cols, planes="row", layout="padded", block=None, device=None):
        """A weight with exactly `planes` allocated, zero."""
        raise NotImplementedError

    def writeback(self, items, **options):
        """The format's bucket writeback over `items` (see its class for the options)."""
        return self.writeback_class(items, **options)

    def scale_conversion(self, rows, cols, plane, from_layout, to_layout):
        """convert_scales of one geometry prepared once (FSDP2's assembly, at every gather):
        an object whose run(src, out) converts `src` into `out` (torch tensors of the two
        layouts' shapes) and returns `out`."""
        raise NotImplementedError

    def fsdp_writeback(self, rows, cols, scales, master, start, length, send_data, *, block=None, rounding=None,
                       round_through=None):
        """FSDP2's one-item writeback of a rank's shard [start, start+length) of the flat weight:
        (primary, writeback). The primary holds the COMPACT `scales` ({plane: tensor}) and no data;
        the shard's bytes go to fragments at the front of `send_data` ({source plane: tensor},
        send_sources' planes); group=None, gather=False: no collective."""
        raise NotImplementedError


def _planes(planes):
    return ("row", "col") if planes == "both" else ("row",)


def _region(name, geometry):
    """(name, height, block_rows, per_row, row_step, col_step): a region's name before the C
    library's geometry of it (_arrays.wb_region, nvfp4.nvfp4_wb_region)."""
    return (name, *geometry)


class _Conversion:
    """Format.scale_conversion of a format without a prepared call: run() is its checked
    convert function `fn` with the arguments given once."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, rows, cols, plane, from_layout, to_layout):
        self.fn, self.args = fn, (rows, cols, plane, from_layout, to_layout)

    def run(self, src, out):
        rows, cols, plane, fl, tl = self.args
        return self.fn(rows, cols, plane, src, fl, tl, out=out)


class _MXFP8(Format):
    __slots__ = ()
    name = "mxfp8"
    weight_class = MXFP8Weight
    writeback_class = BucketWriteback
    block_elems = L.BLOCK
    blocks = ("1x32",)
    roundings = ("ceil", "floor")
    option = "rounding"
    option_choices = roundings
    fixed_note = "MXFP8 blocks are 1x32"
    buffers = ("row_data", "row_scale", "col_data", "col_scale")
    codes = {"data": "E4M3", "scale": "E8M0"}
    e4m3_buffers = ("row_data", "col_data")

    def spec_options(self, rounding=None, block=None):
        return (self.default_rounding if rounding is None else rounding, self.default_block)

    def scale_shape(self, rows, cols, plane, layout):
        return A.scale_shape(rows, cols, plane, layout)

    def data_shape(self, rows, cols, plane):
        return (rows, cols)

    def plane_bytes(self, rows, cols):
        return rows * cols

    def fragment_bytes(self, start, length):
        return length

    def regions(self, rows, cols, planes="row", block=None):
        return [_region(p, A.wb_region(rows, cols, p)) for p in _planes(planes)]

    def slot_offsets(self, wb, world):
        (row_off, col_off), = wb.slots()
        return {"row": row_off, "col": col_off}, None

    def weight(self, rows, cols, *, layout="padded", block=None, amax=None, **planes):
        if amax is not None or block not in (None, "1x32"):
            raise ValueError(f"MXFP8 weights have no amax and 1x32 blocks: drop amax=/block= (got block={block!r})")
        return MXFP8Weight(rows, cols, layout=layout, **planes)

    def empty(self, rows, cols, planes="row", layout="padded", block=None, device=None):
        return MXFP8Weight.empty(rows, cols, planes=planes, layout=layout, device=device)

    def quantize(self, primary, src, rounding="ceil", src_dtype=None):
        """ops.quantize: the whole `src` into `primary`'s planes (E8M0 `rounding`)."""
        return _mx.quantize(primary, src, rounding=rounding, src_dtype=src_dtype)

    def dequantize(self, primary, plane=None, dtype="bf16", out=None):
        return _mx.dequantize(primary, plane=plane, dtype=dtype, out=out)

    def convert_scales(self, rows, cols, plane, src, from_layout, to_layout, out=None, checked=True):
        """One scale plane from one layout to another. checked=False: ops.convert_scales_built
        (contiguous uint8 torch tensors of the right sizes by construction; the C library still
        validates)."""
        if checked:
            return _mx.convert_scales(rows, cols, plane, src, from_layout, to_layout, out)
        return _mx.convert_scales_built(rows, cols, plane, src, from_layout, to_layout, out)

    def scale_conversion(self, rows, cols, plane, from_layout, to_layout):
        """ops.ScaleConversion: the options decoded once, run(src, out) per call (the unchecked
        call of convert_scales(checked=False))."""
        return _mx.ScaleConversion(rows, cols, plane, from_layout, to_layout)

    def fsdp_writeback(self, rows, cols, scales, master, start, length, send_data, *, block=None, rounding=None,
                       round_through=None):
        primary = MXFP8Weight(rows, cols, layout="compact", **{f"{p}_scale": s for p, s in scales.items()})
        frags = {p: send_data[p].view(-1)[:length] for p in scales}
        wb = BucketWriteback([(primary, master, start, length, (frags.get("row"), frags.get("col")))],
                             rounding=self.default_rounding if rounding is None else rounding,
                             round_through=round_through, mode="fused", gather=False)
        return primary, wb


class _NVFP4(Format):
    __slots__ = ()
    name = "nvfp4"
    weight_class = _nv.NVFP4Weight
    writeback_class = NVFP4BucketWriteback
    block_elems = L.NVFP4_BLOCK
    blocks = ("1x16", "16x16")
    roundings = ("nearest",)
    option = "block"
    option_choices = blocks
    fixed_note = "NVFP4 scales are E4M3, rounded to nearest"
    has_amax = True
    packed = True
    buffers = ("row_data", "row_scale", "col_data", "col_scale", "amax")
    codes = {"data": "packed E2M1", "scale": "E4M3"}
    e4m3_buffers = ("row_scale", "col_scale")

    def spec_options(self, rounding=None, block=None):
        return (self.default_rounding, self.default_block if block is None else block)

    def block_height(self, plane, block=None):
        return self.block_elems if block == "16x16" else super().block_height(plane, block)

    def transposed(self, plane):
        return plane == G.PLANE_COL

    def scale_shape(self, rows, cols, plane, layout):
        return _nv.nvfp4_scale_shape(rows, cols, plane, layout)

    def data_shape(self, rows, cols, plane):
        return _nv.nvfp4_data_shape(rows, cols, plane)

    def plane_bytes(self, rows, cols):
        return (rows * cols + 1) // 2

    def fragment_bytes(self, start, length):
        return _nv.nvfp4_fragment_bytes(start, length)

    def regions(self, rows, cols, planes="row", block=None):
        if block == "16x16":   # one region of tiles for both planes
            return [_region("tile", _nv.nvfp4_wb_region(rows, cols, "row", "16x16"))]
        return [_region(p, _nv.nvfp4_wb_region(rows, cols, p)) for p in _planes(planes)]

    def amax_entries(self, world):
        return 1 if world > 1 else 0

    def data_send_shape(self, rows, cols, world):
        """As Format's, except evenly sharded: the S*cols/2 packed bytes of a rank's fragment
        (FSDP2 then takes inputs of any shape)."""
        if G.is_even(rows, world):
            return (self.fragment_bytes(0, G.chunk_rows(rows, world) * cols),)
        return super().data_send_shape(rows, cols, world)

    def scratch_bytes(self, rows, cols, planes, layout):
        return max(math.prod(self.scale_shape(rows, cols, p, layout)) + 2 * self.plane_bytes(rows, cols)
                   for p in _planes(planes))

    def check_shards(self, rows, cols, world, name):
        """Every shard must start at an even element: ceil(rows/world) * cols even, unless rank 0
        holds every row (contract 9.8)."""
        S = G.chunk_rows(rows, world)
        if S < rows and (S * cols) % 2:
            raise NotImplementedError(
                f"mxshard: use an even in_features, a world size with ceil(out_features/world) even, or MXFP8 for "
                f"{name} ({rows}x{cols}, NVFP4) over {world} ranks: each rank's {S} rows x {cols} columns is an odd "
                f"number of elements, so a shard would start mid-byte of the packed plane (contract 9.8)")

    def send_sources(self, planes, block=None):
        """'row', and 'col' (the column stage) for "both"; 16x16 sends its row plane alone (finish
        transposes it into the column plane)."""
        return ("row",) if block == "16x16" else _planes(planes)

    def entry_view(self, wb):
        t = A.torch_mod()
        return wb.packed.view(t.int16 if wb.entry_bytes == 2 else t.int32)

    def clear_status(self, wb):
        self.entry_view(wb)[-1] = 0

    def slot_offsets(self, wb, world):
        s, = wb.slots()
        return ({"row": s["row_entry"], "col": s["col_entry"], "tile": s["tile_entry"]},
                s["amax_entry"] if world > 1 else None)

    def weight(self, rows, cols, *, layout="padded", block=None, amax=None, **planes):
        return _nv.NVFP4Weight(rows, cols, block=self.default_block if block is None else block, layout=layout,
                               amax=amax, **planes)

    def empty(self, rows, cols, planes="row", layout="padded", block=None, device=None):
        return _nv.NVFP4Weight.empty(rows, cols, planes=planes, block=self.default_block if block is None else block,
                                     layout=layout, device=device)

    def quantize(self, primary, src, round_through=None, src_dtype=None):
        """quantize_nvfp4: the whole `src` into `primary`'s planes and amax."""
        return _nv.quantize_nvfp4(primary, src, round_through=round_through, src_dtype=src_dtype)

    def dequantize(self, primary, plane=None, dtype="bf16", out=None):
        return _nv.dequantize_nvfp4(primary, plane=plane, dtype=dtype, out=out)

    def convert_scales(self, rows, cols, plane, src, from_layout, to_layout, out=None, checked=True):
        """One scale plane from one layout to another (always the checked call)."""
        return _nv.convert_nvfp4_scales(rows, cols, plane, src, from_layout, to_layout, out=out)

    def scale_conversion(self, rows, cols, plane, from_layout, to_layout):
        """run(src, out): convert_scales' checked call with these arguments."""
        return _Conversion(_nv.convert_nvfp4_scales, rows, cols, plane, from_layout, to_layout)

    def fsdp_writeback(self, rows, cols, scales, master, start, length, send_data, *, block=None, rounding=None,
                       round_through=None):
        amax = _zeros((1,), master.device, "float32")
        primary = self.weight(rows, cols, block=block, layout="compact", amax=amax,
                              **{f"{p}_scale": s for p, s in scales.items()})
        nb = self.fragment_bytes(start, length)
        frag = {p: send_data[p].view(-1)[:nb] for p in send_data}
        item = dict(primary=primary, master=master, start=start, length=length, row_fragment=frag["row"],
                    stage_fragment=frag.get("col"))
        return primary, NVFP4BucketWriteback([item], round_through=round_through, gather=False)


MXFP8 = _MXFP8()
NVFP4 = _NVFP4()
ALL = (MXFP8, NVFP4)
NAMES = tuple(f.name for f in ALL)
_BY_NAME = {f.name: f for f in ALL}


def get(fmt):
    """The Format of a saved name ('mxfp8' | 'nvfp4'); a Format is returned as it is."""
    if isinstance(fmt, Format):
        return fmt
    f = _BY_NAME.get(fmt) if isinstance(fmt, str) else None
    if f is None:
        raise ValueError(f"format: give one of {', '.join(map(repr, NAMES))} (or mxshard.formats.MXFP8 / NVFP4); "
                         f"{fmt!r} is none of them")
    return f


def of(weight):
    """The Format of a weight object (an MXFP8Weight or NVFP4Weight)."""
    for f in ALL:
        if isinstance(weight, f.weight_class):
            return f
    raise TypeError(f"of: pass an MXFP8Weight or NVFP4Weight, not a {type(weight).__name__}")
