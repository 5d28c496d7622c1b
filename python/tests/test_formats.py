# SPDX-License-Identifier: MIT
"""mxshard.formats: a format is a value. Its geometry equals the rules the
FSDP2 unit worked out with string branches and the scale shapes the package
worked out in Python (kept below, verbatim in meaning, as the reference: the
package now asks the C library for both), its packed regions say where the C
writeback puts each block's entry, it pickles to the very object, and the
package has no two modules importing each other. Runs without torch."""
import ast
import math
import pathlib
import pickle
import random
from collections import namedtuple

import numpy as np
import pytest

import mxshard
from mxshard import formats as F
from mxshard import fsdp_geometry as G
from mxshard.formats import MXFP8, NVFP4

PKG = pathlib.Path(mxshard.__file__).parent


# ---- the reference: the branches the formats replace (torch/fsdp/units.py before issue 34) ----

Spec = namedtuple("Spec", "format planes layout block")


def _cdiv(a, b):
    return -(-a // b)


def _rup(a, b):
    return _cdiv(a, b) * b


def _ref_regions(spec, rows, cols):
    if spec.format == "mxfp8":
        out = [("row", 1, rows, _cdiv(cols, 32), _cdiv(cols, 32), 1)]
        if spec.planes == "both":
            out.append(("col", 32, _cdiv(rows, 32), cols, cols, 1))
        return out
    if spec.block == "16x16":
        return [("tile", 16, _cdiv(rows, 16), _cdiv(cols, 16), _cdiv(cols, 16), 1)]
    out = [("row", 1, rows, _cdiv(cols, 16), _cdiv(cols, 16), 1)]
    if spec.planes == "both":
        out.append(("col", 16, _cdiv(rows, 16), cols, 1, _cdiv(rows, 16)))
    return out


def _ref_scale_height(spec, plane):
    if plane == "row":
        return 1
    return 32 if spec.format == "mxfp8" else 16


def _ref_block_height(fmt, plane, block=None):
    if fmt == "mxfp8":
        return 1 if plane == "row" else 32
    if block == "16x16":
        return 16
    return 1 if plane == "row" else 16


def _ref_scale_shape(spec, rows, cols, plane, layout):
    """[M, K] (padded [round_up(M,128), round_up(K,4)]); MXFP8's column plane k-major [K, M]."""
    n = 32 if spec.format == "mxfp8" else 16
    M, K = (rows, _cdiv(cols, n)) if plane == "row" else (cols, _cdiv(rows, n))
    if layout != "compact":
        M, K = _rup(M, 128), _rup(K, 4)
    return (K, M) if spec.format == "mxfp8" and plane == "col" else (M, K)


def _ref_window_unit(spec, rows, cols, plane):
    m, k = _ref_scale_shape(spec, rows, cols, plane, "compact")
    return m if (spec.format == "nvfp4" and plane == "col") else k


def _ref_data_send_shape(spec, rows, cols, world):
    S = G.chunk_rows(rows, world)
    if spec.format == "nvfp4" and G.is_even(rows, world):
        return (mxshard.nvfp4_fragment_bytes(0, S * cols),)
    return (S, cols)


def _ref_scratch_bytes(spec, rows, cols):
    out = 0
    for p in (("row", "col") if spec.planes == "both" else ("row",)):
        n = math.prod(_ref_scale_shape(spec, rows, cols, p, spec.layout))
        if spec.format == "nvfp4":
            n += 2 * ((rows * cols + 1) // 2)
        out = max(out, n)
    return out


def _ref_supported(spec, rows, cols, world):
    S = G.chunk_rows(rows, world)
    return not (spec.format == "nvfp4" and S < rows and (S * cols) % 2)


def _ref_amax_entries(spec, world):
    return 1 if spec.format == "nvfp4" and world > 1 else 0


def _ref_sources(spec):
    planes = ("row", "col") if spec.planes == "both" else ("row",)
    return planes if not (spec.format == "nvfp4" and spec.block == "16x16") else ("row",)


def _specs():
    for layout in ("compact", "padded", "swizzled"):
        for planes in ("row", "both"):
            yield Spec("mxfp8", planes, layout, "1x32")
            for block in ("1x16", "16x16"):
                yield Spec("nvfp4", planes, layout, block)


def _shapes(n=40, seed=34):
    """Random shapes with 1-element dims, block multiples and non-multiples."""
    rng = random.Random(seed)
    picks = [1, 2, 3, 15, 16, 17, 31, 32, 33, 48, 64, 95, 96, 127, 128, 129]
    out = [(1, 1), (1, 33), (33, 1), (128, 128)]
    for _ in range(n):
        out.append((rng.choice(picks + [rng.randint(1, 300)]), rng.choice(picks + [rng.randint(1, 300)])))
    return out


# ---- one test per rule ----------------------------------------------------------------------

def test_geometry_equals_the_branches_it_replaces():
    for spec in _specs():
        fmt = F.get(spec.format)
        for rows, cols in _shapes():
            assert fmt.regions(rows, cols, spec.planes, spec.block) == _ref_regions(spec, rows, cols)
            assert fmt.scratch_bytes(rows, cols, spec.planes, spec.layout) == _ref_scratch_bytes(spec, rows, cols)
            assert fmt.send_sources(spec.planes, spec.block) == _ref_sources(spec)
            for plane in ("row", "col"):
                assert fmt.scale_height(plane) == _ref_scale_height(spec, plane)
                assert fmt.block_height(plane, spec.block) == _ref_block_height(spec.format, plane, spec.block)
                assert fmt.window_unit(rows, cols, plane) == _ref_window_unit(spec, rows, cols, plane)
                for layout in ("compact", spec.layout):
                    assert fmt.scale_shape(rows, cols, plane, layout) == _ref_scale_shape(spec, rows, cols, plane,
                                                                                          layout)
            for world in (1, 2, 3, 4, 8):
                assert fmt.data_send_shape(rows, cols, world) == _ref_data_send_shape(spec, rows, cols, world)
                assert fmt.amax_entries(world) == _ref_amax_entries(spec, world)
                if _ref_supported(spec, rows, cols, world):
                    fmt.check_shards(rows, cols, world, "w")
                else:
                    with pytest.raises(NotImplementedError, match="odd number of elements"):
                        fmt.check_shards(rows, cols, world, "w")


def test_scale_shapes_are_the_librarys_on_random_shapes():
    """The library's scale shapes (mxs_scale_shape, mxs_nvfp4_scale_shape) are the formulas the
    package used to work out itself, for every plane and layout; 64-bit shapes included."""
    for rows, cols in _shapes(150, seed=35) + [(1 << 20, 1 << 20), (3, (1 << 40) + 5)]:
        for fmt in F.ALL:
            spec = Spec(fmt.name, "both", None, None)
            for plane in ("row", "col"):
                for layout in ("compact", "padded", "swizzled"):
                    assert fmt.scale_shape(rows, cols, plane, layout) == _ref_scale_shape(spec, rows, cols, plane,
                                                                                          layout), (rows, cols)
    assert mxshard.scale_shape(33, 65, "col", "padded") == (4, 128)
    assert mxshard.nvfp4_scale_shape(33, 65, "col", "padded") == (128, 4)


def test_geometry_of_no_shape_plane_or_layout_is_an_error():
    for fmt in F.ALL:
        with pytest.raises(ValueError, match="rows must be >= 1"):
            fmt.scale_shape(0, 5, "row", "compact")
        with pytest.raises(ValueError, match="not 'row', 'col' or 'both'"):
            fmt.scale_shape(5, 5, "diagonal", "compact")
        with pytest.raises(ValueError, match="one plane"):
            fmt.scale_shape(5, 5, "both", "compact")
        with pytest.raises(ValueError, match="not 'compact', 'padded' or 'swizzled'"):
            fmt.scale_shape(5, 5, "row", "tiled")
        with pytest.raises(ValueError, match="cols must be >= 1"):
            fmt.regions(5, 0)
        with pytest.raises(mxshard.SizeOverflowError):
            fmt.regions(1 << 62, 3)
        with pytest.raises(ValueError, match="fit in int64"):   # not wrapped by ctypes
            fmt.scale_shape(1 << 63, 3, "row", "compact")


def _block_values(fmt, x, region, h, nbr, per, rounding="ceil"):
    """[nbr, per]: what the C writeback's partial writes for block (b, j) of a region of the
    [rows, cols] weight x (one rank holding all of it): MXFP8 the block's E8M0 exponent (the
    COMPACT scale of a quantize), NVFP4 its amax as f32 bits."""
    rows, cols = x.shape
    if fmt is MXFP8:
        q = MXFP8.empty(rows, cols, planes="both", layout="compact")
        MXFP8.quantize(q, x, rounding=rounding)
        return q.row_scale if region == "row" else q.col_scale
    width = 1 if region == "col" else 16   # a column's 16x1 blocks; 1x16 blocks and 16x16 tiles
    padded = np.zeros((nbr * h, per * width), np.float32)
    padded[:rows, :cols] = np.abs(x)
    return padded.reshape(nbr, h, per, width).max(axis=(1, 3)).view(np.uint32)


def test_a_regions_entry_is_where_the_writeback_puts_that_blocks_value():
    """Block j of block row b at slot + b*row_step + j*col_step (regions' rule, as the FSDP2 unit
    reads it) holds block (b, j)'s value after the C writeback's
    partial, on random shapes with 1-element dimensions and non-multiples of the block."""
    rng = np.random.default_rng(34)
    for rows, cols in _shapes(16, seed=36):
        # a wide exponent spread: neighbouring blocks hold different exponents and amaxes
        x = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-40, 40, (rows, cols))).astype(np.float32)
        for spec in (s for s in _specs() if s.layout == "compact"):
            fmt = F.get(spec.format)
            w = fmt.empty(rows, cols, planes=spec.planes, layout="compact", block=spec.block)
            wb = fmt.writeback([(w, x.reshape(-1), 0)], **({} if fmt is MXFP8 else {"round_through": None}))
            wb.partial()
            entries = wb.packed if fmt is MXFP8 else wb.packed.view(np.uint32)   # 4-byte entries: f32 amaxes
            offs, amax = fmt.slot_offsets(wb, 1)
            assert amax is None
            for region, h, nbr, per, row_step, col_step in fmt.regions(rows, cols, spec.planes, spec.block):
                at = offs[region] + np.arange(nbr)[:, None] * row_step + np.arange(per)[None, :] * col_step
                want = _block_values(fmt, x, region, h, nbr, per)
                assert np.array_equal(entries[at], want), (spec, rows, cols, region)
            wb.close()


def test_plane_byte_counts_are_the_libraries():
    for rows, cols in _shapes(10):
        for fmt in F.ALL:
            w = fmt.empty(rows, cols, planes="both", layout="compact")
            for plane in ("row", "col"):
                assert getattr(w, f"{plane}_data").size == fmt.plane_bytes(rows, cols)
                assert getattr(w, f"{plane}_data").shape == fmt.data_shape(rows, cols, plane)
                assert getattr(w, f"{plane}_scale").shape == fmt.scale_shape(rows, cols, plane, "compact")
        for start, length in ((0, rows * cols), (2, 0), (4, 7)):
            assert NVFP4.fragment_bytes(start, length) == mxshard.nvfp4_fragment_bytes(start, length)
            assert MXFP8.fragment_bytes(start, length) == length


def test_a_format_round_trips_pickling_and_copying_as_the_same_object():
    import copy
    for fmt in F.ALL:
        assert pickle.loads(pickle.dumps(fmt)) is fmt
        assert copy.deepcopy(fmt) is fmt and copy.copy(fmt) is fmt
        assert F.get(fmt.name) is fmt and F.get(fmt) is fmt


def test_formats_are_equal_by_name_hashable_and_immutable():
    assert MXFP8 == F.get("mxfp8") and MXFP8 != NVFP4 and len({MXFP8, NVFP4, F.get("nvfp4")}) == 2
    assert MXFP8 != "mxfp8"   # a value, not its name
    with pytest.raises(AttributeError):
        MXFP8.block_elems = 16
    with pytest.raises(AttributeError):
        NVFP4.extra = 1
    assert F.NAMES == ("mxfp8", "nvfp4") and repr(NVFP4) == "mxshard.formats.NVFP4"


def test_an_unknown_name_says_which_ones_exist():
    with pytest.raises(ValueError, match="'mxfp8', 'nvfp4'"):
        F.get("fp8")


def test_a_format_owns_its_weight_class_operations_and_writeback():
    x = np.random.default_rng(1).standard_normal((33, 48)).astype(np.float32)
    for fmt in F.ALL:
        w = fmt.empty(33, 48, planes="both")
        assert isinstance(w, fmt.weight_class) and F.of(w) is fmt
        fmt.quantize(w, x)
        y = fmt.dequantize(w, plane="row", dtype="f32")
        assert y.shape == (33, 48) and np.isfinite(y).all()
        wb = fmt.writeback([(fmt.empty(33, 48), x.reshape(-1), 0)])
        assert isinstance(wb, fmt.writeback_class)
        wb.close()
    with pytest.raises(TypeError):
        F.of(object())


def test_the_same_bytes_through_the_format_and_the_module_functions():
    x = np.random.default_rng(2).standard_normal((40, 40)).astype(np.float32)
    a, b = MXFP8.empty(40, 40, planes="both"), mxshard.MXFP8Weight.empty(40, 40, planes="both")
    MXFP8.quantize(a, x, rounding="floor")
    mxshard.quantize(b, x, rounding="floor")
    assert all(np.array_equal(getattr(a, n), getattr(b, n)) for n in MXFP8.buffers)
    a, b = NVFP4.empty(40, 40, planes="both", block="16x16"), mxshard.NVFP4Weight.empty(40, 40, planes="both",
                                                                                          block="16x16")
    NVFP4.quantize(a, x, round_through="bf16")
    mxshard.quantize_nvfp4(b, x, round_through="bf16")
    assert all(np.array_equal(getattr(a, n), getattr(b, n)) for n in NVFP4.buffers)


# ---- the package's import graph --------------------------------------------------------------

def _module_name(path):
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports():
    """{module: {(imported module, name or None)}} of every module of the package, imports inside
    functions included."""
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    out = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1]) if node.level else ""
                target = ".".join(x for x in (base, node.module) if x)
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    found.add((sub, None) if sub in mods else (target, a.name))
            elif isinstance(node, ast.Import):
                found.update((a.name, None) for a in node.names)
        out[mod] = {(m, n) for m, n in found if m in mods and m != mod}
    return out


def test_no_two_modules_import_each_other():
    deps = {m: {t for t, _ in v} for m, v in _imports().items()}
    pairs = sorted({tuple(sorted((a, b))) for a in deps for b in deps[a] if a in deps.get(b, ())})
    assert pairs == []
    assert "mxshard.weight" not in deps["mxshard.ops"]   # the weight's methods call ops, one floor down


def test_nvfp4_takes_no_private_name_of_the_mxfp8_modules():
    imports = _imports()
    mxfp8 = {"mxshard.ops", "mxshard.weight", "mxshard.writeback"}
    for mod in ("mxshard.nvfp4", "mxshard.nvfp4_writeback"):
        assert not {(m, n) for m, n in imports[mod] if m in mxfp8}, mod
