# SPDX-License-Identifier: MIT
"""safetensors files: the `safetensors` package when it is installed, else a
small writer/reader of the same format:

    8 bytes   little-endian u64 N, the header length
    N bytes   JSON: {"__metadata__": {str: str}, name: {"dtype", "shape",
              "data_offsets": [begin, end]}, ...} (padded with spaces to a
              multiple of 8)
    rest      the tensors' raw little-endian bytes, offsets relative to here

Both paths write and read the same files (test_train_smoke.py checks one
against the other when the package is present).
"""
from __future__ import annotations

import json
import struct

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
NAMES = {v: k for k, v in DTYPES.items()}


def _have_pkg():
    try:
        import safetensors.torch  # noqa: F401  (only: is it there)
        return True
    except ImportError:
        return False


def save(tensors: dict, metadata: dict, path: str, use_package: bool | None = None):
    """tensors: name -> tensor (any device; copied to CPU); metadata: str -> str."""
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    _auto = use_package is None
    if use_package is None:
        use_package = _have_pkg()
    if use_package:
        try:
            import safetensors.torch as st
            st.save_file(cpu, path, metadata=metadata)
            return "safetensors"
        except Exception:  # noqa: BLE001 - e.g. an old package without F8_E4M3: the built-in writer
            if not _auto:
                raise
    header = {"__metadata__": dict(metadata)}
    off = 0
    order = sorted(cpu)
    for k in order:
        t = cpu[k]
        n = t.numel() * t.element_size()
        header[k] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for k in order:
            t = cpu[k]
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return "builtin"


def load(path: str, use_package: bool | None = None):
    """-> (tensors: name -> CPU tensor, metadata: dict)."""
    if use_package is None:
        use_package = _have_pkg()
    if use_package:
        try:
            from safetensors import safe_open
            out = {}
            with safe_open(path, framework="pt", device="cpu") as f:
                meta = f.metadata() or {}
                for k in f.keys():
                    out[k] = f.get_tensor(k)
            return out, meta
        except Exception:  # noqa: BLE001 - fall back to the built-in reader (same format)
            pass
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode())
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for k, h in header.items():
        a, b = h["data_offsets"]
        dt = DTYPES[h["dtype"]]
        buf = bytearray(raw[base + a:base + b])
        t = torch.frombuffer(buf, dtype=torch.uint8) if b > a else torch.empty(0, dtype=torch.uint8)
        out[k] = t.view(dt).reshape(h["shape"]).clone()
    return out, meta
