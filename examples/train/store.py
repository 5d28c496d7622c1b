# SPDX-License-Identifier: MIT
"""The parameter store of one data-parallel rank: the FP32 master shard and
AdamW state, the flat gradient buffer, and the model's weights, which are

  * variant "mxfp8": MXFP8 primaries (mxshard.MXFP8Weight views into one
    row-wise data buffer and, for the bidirectional weights, one column-wise
    data buffer), written every step by ONE mxshard.BucketWriteback
    (partial -> one uint8 MAX all-reduce -> apply), then one byte all-gather
    per plane buffer; the dense parameters (embeddings, norms, head) as bf16;
  * variant "bf16": one bf16 buffer for every parameter, cast from the master
    shard and all-gathered every step (the baseline).

Buffers never move: their data pointers are recorded at construction and
checked after every step (assert_pointers).
"""
from __future__ import annotations

import time

import torch

import mxshard
from shard import KIND_BOTH, KIND_DENSE, KIND_ROW, AdamW, Comm, Layout, RegionGather

PHASES = ("fwd_bwd", "grad_sync", "optim", "wb_partial", "wb_reduce", "wb_apply", "gather")


class Timer:
    def __init__(self, device, enabled=True):
        self.cuda = device.type == "cuda"
        self.device = device
        self.enabled = enabled
        self.t = {}

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def start(self):
        if self.enabled:
            self.sync()
        self.t0 = time.perf_counter()

    def stop(self, phase):
        if self.enabled:
            self.sync()
        t1 = time.perf_counter()
        self.t[phase] = self.t.get(phase, 0.0) + (t1 - self.t0) * 1e3
        self.t0 = t1


class Store:
    def __init__(self, layout: Layout, comm: Comm, device, variant: str, *, scale_layout="padded",
                 rounding="ceil", round_through=None, wb_mode="fused", weight_decay=0.1):
        self.layout, self.comm, self.device, self.variant = layout, comm, device, variant
        r = comm.rank
        L = layout
        self.lo, self.hi = L.rank_range(r)
        S = L.shard
        f32 = dict(dtype=torch.float32, device=device)
        # ---- optimizer side: this rank's contiguous range of the flat vector
        self.master = torch.zeros(S, **f32)
        self.opt = AdamW(self.master, L.decay_segments(r), weight_decay=weight_decay)
        self.grad_full = torch.zeros(L.n_pad, **f32)
        if comm.world == 1 or not comm.direct:
            self.grad_shard = self.grad_full[self.lo:self.hi]   # a view: no copy (world 1 / gloo)
        else:
            self.grad_shard = torch.zeros(S, **f32)
        self.linear = {s.name: s for s in L.specs if s.linear}
        self.dense_specs = [s for s in L.specs if not s.linear]
        self.leaves = {}
        self.bucket = None
        self.gathers = []
        if variant == "bf16":
            self._build_bf16()
        else:
            self._build_mxfp8(scale_layout, rounding, round_through, wb_mode)
        self.ptrs = self._pointers()

    # ---- construction -------------------------------------------------------

    def _build_bf16(self):
        L = self.layout
        self.wbuf = torch.zeros(L.n_pad, dtype=torch.bfloat16, device=self.device)
        self.views = {s.name: self.wbuf[s.offset:s.offset + s.numel].view(s.shape) for s in L.specs}
        self.gathers.append(RegionGather(L, self.comm, self.wbuf, 0, L.n_pad, "bf16_weights"))
        # cast: master shard -> my chunk of the bf16 buffer
        self.cast_pairs = [(self.wbuf[self.lo:self.hi], self.master)]

    def _build_mxfp8(self, scale_layout, rounding, round_through, wb_mode):
        L = self.layout
        dev = self.device
        mx = [s for s in L.specs if s.kind in (KIND_ROW, KIND_BOTH)]
        both = [s for s in mx if s.kind == KIND_BOTH]
        # row-wise data: one buffer over the whole padded flat vector (the bytes
        # under the dense parameters are unused: n_dense bytes) -> in-place gather
        self.rowbuf = torch.zeros(L.n_pad, dtype=torch.uint8, device=dev)
        # column-wise data: the bidirectional region [0, n_both) only (they come first)
        all_both = len(both) == len(mx) and len(mx) > 0
        self.col_lo, self.col_hi = (0, L.n_pad) if all_both else (0, L.n_both)
        self.colbuf = torch.zeros(self.col_hi - self.col_lo, dtype=torch.uint8, device=dev) if both else None
        # scales, one buffer per plane, each weight's scales a view in `scale_layout`
        rs = [int(torch.Size(mxshard.scale_shape(*s.shape, "row", scale_layout)).numel()) for s in mx]
        cs = [int(torch.Size(mxshard.scale_shape(*s.shape, "col", scale_layout)).numel()) for s in both]
        self.rowscale = torch.zeros(max(sum(rs), 1), dtype=torch.uint8, device=dev)
        self.colscale = torch.zeros(max(sum(cs), 1), dtype=torch.uint8, device=dev) if both else None
        self.primaries = {}
        self.scale_layout = scale_layout
        ro = co = 0
        items = []
        for s in mx:
            rows, cols = s.shape
            n = s.numel
            rsh = mxshard.scale_shape(rows, cols, "row", scale_layout)
            kw = {"row_data": self.rowbuf[s.offset:s.offset + n].view(rows, cols),
                  "row_scale": self.rowscale[ro:ro + _numel(rsh)].view(rsh)}
            ro += _numel(rsh)
            if s.kind == KIND_BOTH:
                csh = mxshard.scale_shape(rows, cols, "col", scale_layout)
                c0 = s.offset - self.col_lo
                kw["col_data"] = self.colbuf[c0:c0 + n].view(rows, cols)
                kw["col_scale"] = self.colscale[co:co + _numel(csh)].view(csh)
                co += _numel(csh)
            w = mxshard.MXFP8Weight.from_buffers(rows, cols, layout=scale_layout, **kw)
            self.primaries[s.name] = w
            start, length, pos = L.shard_of(self.comm.rank, s)
            master = self.master[pos:pos + length] if length > 0 else self.master[0:0]
            items.append((w, master, start, length))
        group = None
        if self.comm.world > 1:
            import torch.distributed as dist
            group = dist.group.WORLD
        # ONE bucket for every MXFP8 weight: one packed exponent buffer, one MAX all-reduce.
        # gather=False: the training loop gathers the plane buffers itself (RegionGather),
        # with collectives that work on every backend (gloo has no CUDA all_gather_into_tensor
        # in some torch versions).
        self.bucket = mxshard.BucketWriteback(items, rounding=rounding, round_through=round_through,
                                              mode=wb_mode, group=group, gather=False)
        self.gathers.append(RegionGather(L, self.comm, self.rowbuf, 0, L.n_pad, "row_plane"))
        if both:
            self.gathers.append(RegionGather(L, self.comm, self.colbuf, self.col_lo, self.col_hi, "col_plane"))
        # dense parameters: bf16, their flat region [n_mx, total)
        self.dense_lo, self.dense_hi = L.n_mx, L.total
        self.densebuf = torch.zeros(self.dense_hi - self.dense_lo, dtype=torch.bfloat16, device=dev)
        self.views = {s.name: self.densebuf[s.offset - self.dense_lo:s.offset - self.dense_lo + s.numel]
                      .view(s.shape) for s in L.specs if s.kind == KIND_DENSE}
        self.gathers.append(RegionGather(L, self.comm, self.densebuf, self.dense_lo, self.dense_hi,
                                         "dense_bf16"))
        a, b = L.owned(self.comm.rank, self.dense_lo, self.dense_hi)
        self.cast_pairs = [(self.densebuf[a - self.dense_lo:b - self.dense_lo],
                            self.master[a - self.lo:b - self.lo])] if b > a else []

    def _pointers(self):
        ps = {}
        for k in ("rowbuf", "colbuf", "rowscale", "colscale", "densebuf", "wbuf", "master", "grad_full"):
            t = getattr(self, k, None)
            if t is not None:
                ps[k] = t.data_ptr()
        for n, w in getattr(self, "primaries", {}).items():
            for pn in ("row_data", "row_scale", "col_data", "col_scale"):
                t = getattr(w, pn)
                if t is not None:
                    ps[f"{n}.{pn}"] = t.data_ptr()
        if self.bucket is not None:
            ps["bucket.packed"] = self.bucket.packed.data_ptr()
        return ps

    def assert_pointers(self):
        now = self._pointers()
        assert now == self.ptrs, "a primary / buffer moved: " + str(
            [k for k in now if now[k] != self.ptrs.get(k)])

    # ---- what the model reads ------------------------------------------------

    dequant_impl = "mxshard"

    def _dequant(self, w, plane):
        if self.dequant_impl == "mxshard":
            return w.dequantize(plane=plane, dtype="bf16")
        return torch_dequant(w, plane, self.scale_layout)

    def weight_fwd(self, name):
        if self.variant == "bf16":
            return self.views[name]
        return self._dequant(self.primaries[name], "row")

    def weight_bwd(self, name):
        if self.variant == "bf16":
            return self.views[name]
        w = self.primaries[name]
        return self._dequant(w, "col" if w.has_col else "row")

    def dequant_check(self):
        """mxshard.dequantize of every plane vs an independent torch decode of the
        same bytes (bit comparison). If the package's dequantize raises, the run
        continues on the torch decode and says so."""
        if self.variant == "bf16":
            return None
        planes = bad = 0
        for n, w in self.primaries.items():
            for pn in ("row", "col"):
                if not getattr(w, f"has_{pn}"):
                    continue
                ref = torch_dequant(w, pn, self.scale_layout)
                try:
                    got = w.dequantize(plane=pn, dtype="bf16")
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    self.dequant_impl = "torch"
                    return {"identical": False, "error": repr(e), "fallback": "torch decode"}
                planes += 1
                bad += int((got.view(torch.int16) != ref.view(torch.int16)).sum())
        return {"planes": planes, "mismatched_elements": bad, "identical": bad == 0 and planes > 0,
                "used": self.dequant_impl}

    def put_weight_grad(self, name, gw):
        s = self.linear[name]
        self.grad_full[s.offset:s.offset + s.numel].view(s.shape).copy_(gw)

    def begin_step(self):
        """Fresh autograd leaves over the dense bf16 parameters (sharing storage)."""
        self.leaves = {s.name: self.views[s.name].detach().requires_grad_(True) for s in self.dense_specs}

    def dense(self, name):
        return self.leaves[name]

    def collect_dense_grads(self):
        for s in self.dense_specs:
            g = self.leaves[s.name].grad
            dst = self.grad_full[s.offset:s.offset + s.numel]
            if g is None:
                dst.zero_()
            else:
                dst.copy_(g.reshape(-1))
        self.leaves = {}

    # ---- the update ----------------------------------------------------------

    def grad_sync(self):
        self.comm.reduce_scatter_sum(self.grad_full, self.grad_shard)

    def optim(self, lr):
        self.opt.step(self.grad_shard, lr)

    def writeback(self, timer: Timer):
        """master shard -> weights on every rank. Phases: wb_partial, wb_reduce,
        wb_apply (incl. the bf16 cast of dense parameters), gather."""
        if self.variant == "bf16":
            self._cast_and_gather(timer)
            return
        err = None
        try:
            self.bucket.partial()   # on failure: buffer zeroed, status byte 1, error raised
        except Exception as e:  # noqa: BLE001 - join the reduction first (never hang the others)
            err = e
        timer.stop("wb_partial")
        self.comm.all_reduce_max_u8(self.bucket.packed)
        timer.stop("wb_reduce")
        if err is not None:
            raise err
        self.bucket.apply()     # reads the group status byte first (RemoteError if a rank failed)
        self._cast_and_gather(timer)

    def _cast_and_gather(self, timer: Timer):
        """The bf16 casts (counted in wb_apply), then the byte gathers."""
        for dst, src in self.cast_pairs:
            dst.copy_(src)
        timer.stop("wb_apply")
        for g in self.gathers:
            g.run()
        timer.stop("gather")

    # ---- accounting ------------------------------------------------------------

    def buffer_bytes(self):
        def nb(t):
            return 0 if t is None else t.numel() * t.element_size()
        out = {"master_shard": nb(self.master), "adam_m_v_tmp": nb(self.opt.m) + nb(self.opt.v) + nb(self.opt.tmp),
               "grad_full": nb(self.grad_full),
               "grad_shard_extra": 0 if self.grad_shard.data_ptr() >= self.grad_full.data_ptr() and
               self.grad_shard.data_ptr() < self.grad_full.data_ptr() + nb(self.grad_full) else nb(self.grad_shard)}
        if self.variant == "bf16":
            out["weights_bf16"] = nb(self.wbuf)
        else:
            out["weights_row_data"] = nb(self.rowbuf)
            out["weights_row_scales"] = nb(self.rowscale)
            out["weights_col_data"] = nb(self.colbuf)
            out["weights_col_scales"] = nb(self.colscale)
            out["weights_dense_bf16"] = nb(self.densebuf)
            out["packed_exponents"] = nb(self.bucket.packed)
        out["gather_staging"] = sum(g.staging_bytes() for g in self.gathers)
        return out

    # ---- checkpoint views ------------------------------------------------------

    def primary_tensors(self):
        """name -> tensor of every MXFP8 plane (data as float8_e4m3fn, scales uint8)."""
        out = {}
        for n, w in getattr(self, "primaries", {}).items():
            for pn in ("row", "col"):
                d = getattr(w, f"{pn}_data")
                if d is None:
                    continue
                out[f"primary.{n}.{pn}_data"] = d.view(torch.float8_e4m3fn)
                out[f"primary.{n}.{pn}_scale"] = getattr(w, f"{pn}_scale")
        return out

    def weight_tensors(self):
        """Everything the forward reads: the MXFP8 planes and the bf16 weights."""
        out = self.primary_tensors()
        out.update({f"bf16.{n}": v for n, v in self.views.items()})
        return out


def torch_dequant(w, plane, layout):
    """Reference decode with torch ops only: e4m3 -> f32 times 2^(e-127) built
    from its bit pattern (2^-127 for e = 0, NaN for e = 255), then bf16."""
    rows, cols = w.rows, w.cols
    data = getattr(w, f"{plane}_data").reshape(rows, cols)
    sc = getattr(w, f"{plane}_scale")
    kb = -(-cols // 32) if plane == "row" else -(-rows // 32)
    if layout not in ("compact", "padded"):
        raise ValueError("torch_dequant: compact or padded scales only")
    if plane == "row":
        e = sc.reshape(-1, sc.shape[-1])[:rows, :kb].repeat_interleave(32, dim=1)[:, :cols]
    else:
        e = sc.reshape(-1, sc.shape[-1])[:kb, :cols].repeat_interleave(32, dim=0)[:rows, :]
    e = e.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 0x00400000), e << 23)
    bits = torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits)
    mult = bits.view(torch.float32)
    return (data.view(torch.float8_e4m3fn).to(torch.float32) * mult).to(torch.bfloat16)


def _numel(shape):
    n = 1
    for v in shape:
        n *= int(v)
    return n
