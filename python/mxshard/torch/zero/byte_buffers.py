# SPDX-License-Identifier: MIT
"""The byte buffers of MXFP8Linear / NVFP4Linear as state: which code each
buffer holds, the dtype checkpoints and exports store it as, and the
load_state_dict pre-hook that takes those tensors back as BYTES.

    buffer                MXFP8                      NVFP4
    row_data, col_data    E4M3 codes   (uint8)       packed E2M1, 2 per byte (uint8)
    row_scale, col_scale  E8M0 codes   (uint8)       E4M3 codes (uint8)
    amax                  -                          float32 [1]

Stored as (DCP checkpoint and safetensors export): the E4M3 buffers as
float8_e4m3fn, the rest as they are (uint8, float32).

Why a hook: the module's buffers are uint8, and load_state_dict copies a
float8_e4m3fn tensor into one by VALUE (an E4M3 code 0x72 = 288.0 becomes
the byte 255...), which corrupts the weight without a word. The hook
(registered on every quantized module by _QuantLinear._setup) replaces, in
load_state_dict's own copy of the state dict, every tensor whose dtype
names the buffer's code - uint8 or int8 (raw bytes), float8_e4m3fn for an
E4M3 buffer, float8_e8m0fnu for an E8M0 one, float4_e2m1fn_x2 for packed
E2M1 - by its uint8 view (the same bytes). Any other dtype, or another
shape, is an error in load_state_dict's list (RuntimeError at its end, as
torch does for a size mismatch) and that buffer is left as it is. A dense
`<module>.weight` given for a quantized module is an error too: its bytes
are not the module's planes.

Imports nothing of mxshard.torch (linear.py registers the hook); each code is
its format's (mxshard.formats: Format.codes, Format.e4m3_buffers)."""
from __future__ import annotations

import torch

from ... import formats as _formats

__all__ = ["stored_dtype", "as_buffer_bytes", "_register_byte_load_hook"]

# the torch dtype that names each code (missing in older torch: getattr)
_CODE_DTYPES = {"E4M3": "float8_e4m3fn", "E8M0": "float8_e8m0fnu", "packed E2M1": "float4_e2m1fn_x2"}


def code_of(fmt, name):
    """What buffer `name` of a `fmt` module (an mxshard.formats value or its name) holds: 'E4M3',
    'E8M0', 'packed E2M1' (uint8 buffers) or 'fp32' (NVFP4's amax)."""
    if name == "amax":
        return "fp32"
    return _formats.get(fmt).codes[name.rpartition("_")[2]]


def stored_dtype(fmt, name):
    """The dtype a checkpoint or export stores buffer `name` as (one rule for both)."""
    if name == "amax":
        return torch.float32
    return torch.float8_e4m3fn if name in _formats.get(fmt).e4m3_buffers else torch.uint8


def _byte_dtypes(code):
    """The dtypes taken as the bytes of a `code` buffer."""
    named = getattr(torch, _CODE_DTYPES.get(code, ""), None)
    return (torch.uint8, torch.int8) + ((named,) if isinstance(named, torch.dtype) else ())


def as_buffer_bytes(t, buf, fmt, name, key):
    """Tensor `t` given for buffer `buf` (named `name`, of a `fmt` module; `key`
    names it in messages) as what to copy into it: the uint8 view of `t`
    when its dtype names the buffer's code, `t` itself when it has the
    buffer's dtype. ValueError (saying what to do) for any other dtype or
    shape."""
    code = code_of(fmt, name)
    if tuple(t.shape) != tuple(buf.shape):
        raise ValueError(f"{key}: shape {tuple(t.shape)}, this module's buffer is {tuple(buf.shape)}: the state was "
                         f"saved with another shape, planes, layout or block")
    if code == "fp32":
        if t.dtype != torch.float32:
            raise ValueError(f"{key}: dtype {t.dtype}, the NVFP4 tensor amax is float32 (a cast would change the "
                             f"scales of every block)")
        return t
    ok = _byte_dtypes(code)
    if t.dtype == buf.dtype:
        return t
    if t.dtype in ok:
        return t.view(torch.uint8)
    names = ", ".join(str(d).replace("torch.", "") for d in ok)
    raise ValueError(f"{key}: dtype {t.dtype}, but this buffer holds {code} codes as bytes: only {names} are "
                     f"taken (as bytes); values of another dtype would be cast and corrupt the weight (a dense "
                     f"weight goes in through set_master_, a file of export_safetensors through "
                     f"mxshard.torch.load_safetensors(path, model))")


def _byte_load_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                        error_msgs):
    """load_state_dict pre-hook of a quantized module (see the module doc)."""
    fmt = module.format
    given = False
    for name in module._BUFS:
        buf = module._buffers.get(name)
        key = prefix + name
        if buf is None or key not in state_dict or not isinstance(state_dict[key], torch.Tensor):
            continue   # an absent plane, a missing key or a non-tensor: torch reports it
        given = True
        try:
            state_dict[key] = as_buffer_bytes(state_dict[key], buf, fmt, name, key)
        except ValueError as e:
            error_msgs.append(f"{e} ({type(module).__name__} planes={module.planes!r} layout={module.layout!r})")
            state_dict[key] = buf.detach()   # nothing of the wrong kind goes in
    dense = prefix + "weight"
    if not given and isinstance(state_dict.get(dense), torch.Tensor):
        if _DENSE_FIX not in error_msgs:  # the fix once, first; then one short line per weight
            error_msgs.append(_DENSE_FIX)
        error_msgs.append(f"  {dense} (the module holds {', '.join(n for n in module._BUFS if module._buffers.get(n) is not None)})")


_DENSE_FIX = ("Load dense weights into the model before ShardedOptimizer takes it over (a convert()ed model loads "
              "them as it is), or call module.set_master_(weight) then opt.masters_from_model(); a file of "
              "export_safetensors loads with mxshard.torch.load_safetensors(path, model). These dense weights "
              "were given for byte-buffer linears:")


def _register_byte_load_hook(module):
    """Registers the byte-taking load_state_dict pre-hook on quantized `module`."""
    return module.register_load_state_dict_pre_hook(_byte_load_pre_hook)
