# SPDX-License-Identifier: MIT
"""ShardedOptimizer: a ZeRO-1 / Megatron-style distributed optimizer for any
nn.Module whose linears may be MXFP8Linear or NVFP4Linear (weights held only
as MXFP8 / NVFP4 primaries; the fp32 masters live sharded in the optimizer).

    model = mxshard.torch.convert(model, policy="row")
    opt = mxshard.torch.ShardedOptimizer(
        model, lambda groups: torch.optim.AdamW(groups, lr=1e-3), bucket_size=40_000_000)
    for batch in data:
        loss = model(batch).sum()
        loss.backward()          # hooks reduce each bucket as soon as its gradients are complete
        opt.step()               # reduce -> norm/clip -> inner step on the shards -> writeback
        opt.zero_grad()

What it owns (assigned once at construction, never moved afterwards):

- per bucket an fp32 master SHARD (this rank's S elements), an fp32 gradient
  buffer over the whole bucket (the local accumulation target: every
  MXFP8Linear's / NVFP4Linear's ``main_grad`` is a view of it, dense
  parameters' gradients are added into it by a post-accumulate-grad hook,
  which then sets ``p.grad = None``), a row-plane byte buffer holding every
  MXFP8 weight's ``row_data`` (and a col-plane one for the "both" weights),
  one scale buffer per plane, likewise for the NVFP4 weights (packed row
  planes, the transposed column planes, E4M3 scales, one fp32 ``amax`` per
  weight), and one buffer per dense dtype whose views ARE the dense
  parameters' ``.data``. A bucket may mix MXFP8, NVFP4 and dense items
  (mxshard.torch.zero.layout: NVFP4 items at even offsets, even shard boundaries);
- the inner optimizer (an ELEMENTWISE torch.optim optimizer: SGD, Adam,
  AdamW, Adamax, NAdam, RAdam, Adagrad, Adadelta, RMSprop, ASGD, Rprop;
  built by ``optimizer_factory``) over views of the master shards: per
  bucket, one view per run of items of one param group inside this rank's
  range. Views span several parameters and cut parameters at shard
  boundaries, so anything else (Adafactor, Muon, LBFGS) is refused
  (``assume_elementwise=True`` accepts another optimizer on your word).

ShardedOptimizer IS a torch.optim.Optimizer: ``param_groups`` is the inner
optimizer's list (the same dicts: an LR scheduler's lr is the inner
optimizer's lr), ``state`` its state (keyed by the master views), step
hooks work; LambdaLR(opt) and every other scheduler take it.

Every rank must build the same model (same shapes, same order, same initial
values: seed them alike) with the same arguments; the construction checks
that the configurations agree (PlanMismatchError otherwise; the values are
not compared) and ends with one writeback, so that the primaries are the
quantization of the masters and the dense parameters the masters cast to
their dtype, on every rank (each rank's master shard comes from its own
model, so ranks that started from different values end up with a mix).

After construction the model's storage belongs to the optimizer: do not
move the model (.to(), .cuda(), replacing a parameter's .data or an
MXFP8Linear's main_grad) and do not write into its weights
(model.load_state_dict(), p.copy_()) without telling the optimizer:
step() checks both (version counters) and raises, on every rank, rather
than write the masters back over what was loaded. After such a write call
``masters_from_model()`` (the model's values become the masters; a
quantized weight's master becomes its row plane dequantized to fp32, a
dense parameter's its value; the inner state is kept) or
``model_from_masters()`` (undo the write, e.g. after evaluating EMA
weights); restore a whole training state with mxt.load_checkpoint or
load_state_dict(). A quantized linear's ``set_master_(w)`` is such a write
(on every rank, then ``masters_from_model()``). Freezing or unfreezing
(requires_grad) after construction, or casting the model, also makes
step() raise on every rank: do it before building the optimizer. A deep
copy of the model (torch.optim.swa_utils.AveragedModel's) evaluates as the
model does, outside the optimizer, but its quantized planes refuse in-place
writes (an EMA of them would be silently wrong: the fp32 weights exist only
as the sharded masters). Do not wrap the model in DistributedDataParallel (refused
at construction): ShardedOptimizer reduces the gradients itself. A dense
parameter's ``.grad`` is a HeldGrad placeholder after each backward (the
gradient is in the bucket buffer; held_grad): clip with
``max_grad_norm``; torch.nn.utils.clip_grad_norm_ raises, saying so; the
norm is ``last_grad_norm``. ``step(closure)`` evaluates the closure
(with grad enabled) first.

step(), in order:
  0. when no gradient was written on ANY rank since the last zero_grad() or
     step() (no backward), step() changes nothing (weights, masters, inner
     state, steps), as torch.optim leaves a parameter whose .grad is None
     alone; it still runs steps 1-2 (every rank must agree). Granularity:
     when any rank wrote any gradient, every item is stepped, those that got
     none with a zero gradient (an unused parameter: weight decay and
     momentum still move it, as in Megatron's distributed optimizer);
  1. every bucket's gradient reduction (those not launched by the hooks are
     launched now, in bucket order) and a wait for all of them; local checks
     (no item's storage replaced or reshaped, nothing written into the
     model's weights from outside, since the last writeback);
  2. ONE all_reduce(SUM) of [sum of squares of this rank's gradient shards,
     local failure flag, gradient-written flag] (fp64): if any rank failed every rank raises (that
     rank its own error, the others mxshard.RemoteError); the global norm is
     kept in ``last_grad_norm``; with ``max_grad_norm`` the shards are
     multiplied by min(1, max_grad_norm / (norm + 1e-6))
     (torch.nn.utils.clip_grad_norm_'s formula);
  3. the inner optimizer's step on the fp32 shards;
  4. per bucket with MXFP8 weights, one mxshard.BucketWriteback run: one
     uint8 MAX all-reduce, then one byte all-gather per present plane; per
     bucket with NVFP4 weights, one mxshard.NVFP4BucketWriteback run: ONE
     MAX all-reduce of the packed block amaxes (which also yields each
     weight's global amax: no second reduction), the cast of the shard,
     one byte all-gather of the row planes and, when a "both" 1x16 weight
     is in the bucket, one of the column stage, then the local transpose
     into the column-wise planes;
  5. per bucket and dense dtype: the cast of this rank's master range into
     that dtype and one all-gather.
  Nothing is zeroed: call zero_grad() before the next backward.

Collectives per step (world > 1; ``opt.collectives`` counts them by kind,
construction's own are in ``opt.setup_collectives``):

    kind               per step
    reduce_scatter     1 per bucket (backends with reduce_scatter_tensor)
    all_reduce_grad    1 per bucket (gloo: all_reduce of the bucket, then slice)
    all_reduce_norm    1
    all_reduce_max          1 per bucket with MXFP8 weights
    all_gather_row          1 per bucket with MXFP8 weights
    all_gather_col          1 per bucket with "both" MXFP8 weights
    all_reduce_nvfp4        1 per bucket with NVFP4 weights
    all_gather_nvfp4_row    1 per bucket with NVFP4 weights
    all_gather_nvfp4_stage  1 per bucket with "both" 1x16 NVFP4 weights (16x16
                            ones rebuild the column plane from the row plane)
    all_gather_dense        1 per bucket and dense dtype

so B buckets, of which M hold MXFP8 weights (C of them "both" ones) and N
hold NVFP4 weights (T of them "both" 1x16 ones), with D (bucket, dense
dtype) pairs cost B + 1 + 2M + C + 2N + T + D collectives per step; of those
only the 1 + M + N small ones are latency-bound (the norm, the exponent and
the amax maxima). A bucket holding both formats runs both writebacks (two
small maxima).
Construction: 1 all_gather of the fingerprints (+1 all_gather_object only
when they differ), 2 small all_gathers per MXFP8 and per NVFP4 writeback
(their setups), then one writeback (steps 4-5). A world of one issues none.

Gradients: "mean" (default) divides the reduced SUM by the world size, on
the shard after the reduction (one rounding; the sum itself is the
backend's), "sum" does not divide. ``grad_dtype`` is the dtype of the
gradient buffers: torch.float32 (default: accumulation and reduction in
fp32, 4 bytes per element) or torch.bfloat16 (Megatron's
grad_reduce_in_fp32=False: 2 bytes per element; every accumulation rounds
to bf16, the reduction is the backend's bf16 SUM, then this rank's shard is
upcast to fp32, divided by the world size there, and the inner optimizer
gets fp32 gradients as always; the masters stay fp32). A quantized linear
accumulates into a bf16 main_grad only if its class lists bfloat16 in
MAIN_GRAD_DTYPES (else construction says so). The hooks launch a bucket's reduction
asynchronously when all of its items have reported in this backward and
every earlier bucket has been launched (buckets are reduced in the same
order on every rank). A bucket with an unused parameter is reduced at the
start of step() (so are all later ones). Gradient accumulation over several
backwards: ``with opt.no_sync():`` around all but the last (otherwise the
second backward finds its buckets already reduced and step() raises).
``overlap=False`` disables the hooks' launches (everything is reduced in
step()). A module called twice in one forward whose second gradient arrives
after its bucket was launched also makes step() raise: use overlap=False
for such models. In eval / under no_grad no hook fires; train()/eval() are
the model's business only. zero_grad(set_to_none=True) zeroes the buffers
(they cannot be None: main_grad views stay) and sets a dense parameter's
.grad (only there when set outside the hooks) to None, set_to_none=False
zeroes it in place.

Failures never hang the group: a rank-local error before the norm
all-reduce (a replaced parameter, a gradient of the wrong shape, a late
gradient) travels in its flag; an error in the inner step marks the
buckets' writeback status bytes, so the others raise RemoteError there;
every rank still runs the remaining collectives of the step before raising
(a model without MXFP8 or NVFP4 weights has no status byte to carry an
inner-step error: then only the failing rank raises). After an exception from step()
call zero_grad() before the next backward.

``opt.param_groups`` is the inner optimizer's list of groups (one per
param group, on every rank, even where this rank's shard holds none of the
group's elements); ``opt.inner`` is the inner optimizer itself.

Checkpoints: state_dict() holds this rank's master shards and the inner
optimizer's state (clones); load_state_dict() needs the same world, rank and
configuration (fingerprint) and rebuilds the primaries and dense parameters
from the loaded masters (a collective: every rank calls it). Resharding
checkpoints (any DP size, through torch.distributed.checkpoint) are
mxshard.torch.checkpoint's save_checkpoint / load_checkpoint: they address
the inner state per view through ``_inner_params()`` and load through
load_state_dict() with shards they assembled for this rank.
torch.distributed.checkpoint.state_dict's get_state_dict / set_state_dict
cannot name these shards: they raise NotImplementedError naming
save_checkpoint. A failed construction releases everything that holds the
process group before it raises (nothing of it outlives
destroy_process_group()).
"""
from __future__ import annotations

import contextlib
import gc
import math
import weakref
from collections import Counter, OrderedDict, namedtuple

import torch

from ... import _lib as L
from . import compat as compat
from . import layout as LY
from .build import Construction
from .build import plain as _plain  # noqa: F401 - mxshard.torch.checkpoint imports it from here
from .grads import Gradients, module_owner, sum_squares
from .held_grad import HeldGrad
from .linear import FSDP_ADVICE as _FSDP_ADVICE, fsdp_touched
from .writeback import PLANE_BUFFERS, Writeback, names_shown
from .comm import Comm

__all__ = ["ShardedOptimizer", "FORMAT", "ItemRow"]

FORMAT = "mxshard.sharded_optimizer/1"
ItemRow = namedtuple("ItemRow", "name kind bucket offset shape")


def _clone_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone_tree(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_clone_tree(v) for v in x)
    return x


class ShardedOptimizer(Construction, Gradients, Writeback, torch.optim.Optimizer):
    """ZeRO-1 sharded optimizer over `model` (see the module doc); a
    torch.optim.Optimizer whose param_groups are the inner optimizer's.

    model              any nn.Module (not a DistributedDataParallel, nor
                       containing one); trainable items are every
                       MXFP8Linear's and NVFP4Linear's weight (its master comes
                       from module.master_init(), which is then released) and
                       every Parameter with requires_grad, in model order,
                       tied ones once
    optimizer_factory  callable(list of param-group dicts) -> an elementwise
                       torch.optim optimizer over exactly those params, e.g.
                       ``lambda g: torch.optim.AdamW(g, lr=1e-3)``
    process_group      a torch.distributed group (default: the world when
                       torch.distributed is initialised, else a world of one)
    bucket_size        elements per bucket (about; a larger item gets its own)
    param_groups       [{"params": [...], **options}, ...]: entries are
                       Parameters, MXFP8Linear / NVFP4Linear modules (their
                       weight), or names (an item's name such as "fc.weight",
                       or such a module's name); items named nowhere go to
                       a last group without overrides
    grad_reduce        "mean" (divide the sum by the world size) or "sum"
    max_grad_norm      clip the global 2-norm to this (None: no clipping)
    round_through      "bf16" (default, as Transformer Engine), "f16" or None:
                       the writeback quantizes the master rounded through it
                       (MXFP8 and NVFP4 alike)
    rounding           "ceil"/"floor" for every MXFP8 weight (None: each
                       module's own; the weights of one bucket must agree;
                       NVFP4 has none)
    overlap            launch reductions from the backward hooks
    align              shard alignment in elements (each bucket is padded
                       to a multiple of world*align)
    grad_dtype         torch.float32 (default) or torch.bfloat16: the dtype
                       of the gradient buffers (accumulation and reduction)
    assume_elementwise accept an inner optimizer outside torch.optim's
                       elementwise ones (your word that it is elementwise)

    Attributes: inner (the inner optimizer), param_groups (its groups),
    state (its state), items (rows of name, kind, bucket, offset, shape),
    plan (the layout), collectives / setup_collectives (Counters),
    last_grad_norm, steps, world, rank.
    """

    def __init__(self, model, optimizer_factory, process_group=None, bucket_size=40_000_000, *,
                 param_groups=None, grad_reduce="mean", max_grad_norm=None, round_through="bf16",
                 rounding=None, overlap=True, align=128, grad_dtype=torch.float32, assume_elementwise=False):
        # torch.optim.Optimizer's own attributes (its __init__ would build param_groups of its own)
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._warned_capturable_if_run_uncaptured = True
        self._patch_step_function()
        self.comm = Comm(process_group)
        self.world, self.rank = self.comm.world, self.comm.rank
        self.setup_collectives = Counter()
        self.collectives = Counter()
        self.comm.counts = self.setup_collectives
        self.last_grad_norm = None
        self.steps = 0
        self._buckets = []
        self._views = []          # the inner optimizer's parameters: views of the master shards
        self._view_at = []        # per view: (bucket index, shard lo, shard hi, group)
        self._hook_errors = []
        self._late = []
        self._reused = []         # late gradients of the backward that launched their bucket
        self._zero_pending = False  # a step() consumed the gradients, no zero_grad() since
        self._sync = True
        self._next = 0
        self._handles = []
        self._undo = []
        self._items = []
        self._expect = []
        self.plan = None
        self.inner = None
        self.fingerprint = 0
        err = None
        try:
            self._validate_args(model, optimizer_factory, bucket_size, grad_reduce, max_grad_norm, round_through,
                                rounding, overlap, align, grad_dtype)
            self._build(model, optimizer_factory, param_groups, assume_elementwise)
            self.fingerprint = LY.fingerprint(self.plan)
        except Exception as e:  # noqa: BLE001 - the group learns of it first
            err = e
        try:
            self._agree(err)
            err = None
            self._build_writebacks()
            local, remote = [], []
            self._writeback_and_gather(local, remote)
            if local or remote:
                raise (local + remote)[0]
        except Exception:
            err = None  # (the exception's traceback holds this frame: no cycle through `err`)
            self._rollback()
            self._release()  # a failed optimizer holds nothing of the process group
            raise
        self._finish()
        # at interpreter exit (an optimizer still alive, close() not called):
        # one gc pass while the interpreter is whole, so that what still holds
        # the process group goes before Python's finalization (see close())
        weakref.finalize(self, gc.collect)

    def _finish(self):
        for it in self._items:
            if it.module is not None and hasattr(it.module, "release_master_init"):
                it.module.release_master_init()
        self._undo = []
        self._ptrs = self._pointers()
        self._grads_seen = self._grad_versions()
        self.comm.counts = self.collectives
        # the inner optimizer's parameters show a HeldGrad between steps (their .grad is set to this rank's
        # reduced shard inside step() only): clip_grad_norm_ over opt.param_groups, or GradScaler's unscale_,
        # would otherwise read a stale local slice, or None, and clip or unscale silently wrong
        self._view_held = [HeldGrad(v, None, "ShardedOptimizer's master shards (opt.param_groups)")
                           for v in self._views]
        self._hold_view_grads()
        self.items = [ItemRow(self._items[p.item].name, self._items[p.item].kind, bs.index, p.offset,
                              self._items[p.item].shape) for bs in self.plan.buckets for p in bs.items]

    # ---- torch.optim.Optimizer ----------------------------------------------------

    @property
    def param_groups(self):
        """The inner optimizer's param groups (the same list and dicts)."""
        return self.inner.param_groups if self.inner is not None else []

    @property
    def state(self):
        """The inner optimizer's state (keyed by the views of the master shards)."""
        return self.inner.state if self.inner is not None else {}

    @property
    def defaults(self):
        return self.inner.defaults if self.inner is not None else {}

    def add_param_group(self, param_group):
        raise NotImplementedError("ShardedOptimizer.add_param_group: the items and groups are fixed at construction "
                                  "(they decide the buckets and shards); build the ShardedOptimizer with every "
                                  "group in param_groups=")

    def __getstate__(self):
        raise TypeError("a ShardedOptimizer cannot be pickled or copied (it owns the model's storage and a process "
                        "group): save opt.state_dict() or use mxt.save_checkpoint")

    # ---- gradients ------------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backwards inside it only accumulate (no
        reductions launched); the next backward outside it launches them."""
        old = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = old

    def zero_grad(self, set_to_none=True):
        """Zero every gradient buffer (the buffers and main_grad views stay),
        reset the readiness of the buckets; a dense parameter's .grad (there
        only when set outside the hooks) becomes None (set_to_none=True) or is
        zeroed in place (False). After a successful step() the next forward
        with grad enabled zeroes the buffers if this was not called: a loop
        that calls model.zero_grad() instead (which cannot reach these
        buffers), or nothing, trains the same."""
        self._zero_grads(set_to_none)

    # ---- the step -------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce, check, clip, update the shards, write the weights back (see
        the module doc); nothing when no rank wrote a gradient since the last
        zero_grad() / step(). Returns the closure's loss (or None)."""
        if compat.called_from_dcp_state_dict():
            raise compat.dcp_error()
        if getattr(self, "_closed", False):
            raise RuntimeError("ShardedOptimizer.step: the optimizer was closed")
        loss, closure_err = None, None
        if closure is not None:
            try:
                with torch.enable_grad():
                    loss = closure()
            except Exception as e:  # noqa: BLE001 - the step's collectives run first: no rank is left waiting
                closure_err = e
        try:
            out = self._step(loss, closure_err)
        finally:
            self._grads_seen = self._grad_versions()
        # the step consumed the gradients (the reduced buffers cannot take another backward on top):
        # the next forward with grad enabled zeroes them first unless zero_grad() came before it
        # (grads.zero_pending_hook), so that model.zero_grad() (which cannot reach these
        # buffers) or no zero_grad() at all trains as opt.zero_grad() does
        self._zero_pending = True
        return out

    def _step(self, loss, closure_err=None):
        errs = [f"the closure raised {type(closure_err).__name__}: {closure_err}"] if closure_err is not None else []
        shards, sq = None, None
        try:
            self._flush(errs)
            arrived = self._grads_arrived()
            self._reduce_all(errs)
        except Exception as e:  # noqa: BLE001
            arrived = True
            errs.append(f"gradient reduction: {e}")
        errs += self._hook_errors
        if self._reused:
            errs.append(f"pass overlap=False to ShardedOptimizer: {names_shown(self._reused)} "
                        f"{'is' if len(self._reused) == 1 else 'are'} used more than once in one forward, and a "
                        f"later use's gradient arrived after its bucket's reduction had started (with "
                        f"overlap=False every reduction waits for step())")
        if self._late:
            late = self._late
            shown = ", ".join(late[:3]) + (f", ... ({len(late)} in all)" if len(late) > 3 else "")
            errs.append(f"accumulate over several backwards inside `with opt.no_sync():` (or pass overlap=False for "
                        f"a module used several times in one forward; after a backward that no step() took, e.g. "
                        f"before mxt.load_checkpoint into this optimizer, call opt.zero_grad() first). Gradients "
                        f"arrived after their bucket's reduction had started: {shown}")
        errs = self._check_not_fsdp() + errs   # (first: what follows from it would only confuse)
        errs += self._check_storage()
        errs += self._check_trainable()
        if not errs:
            # every rank's reduced shard counts, also where this rank wrote no gradient itself (it
            # holds the others' sum): the norm must not depend on which ranks ran a backward
            try:
                shards = self._fp32_shards()
                for g in shards:
                    sq = sum_squares(g, sq)
            except Exception as e:  # noqa: BLE001
                errs.append(f"grad norm: {e}")
        self._reset()
        dev = self.comm.small_device(self.device)
        flag = torch.tensor([0.0, 1.0 if errs else 0.0, 1.0 if arrived else 0.0], dtype=torch.float64, device=dev)
        if sq is not None and not errs:
            flag[0] = sq.to(dev)  # the sum stays on the device: one copy, no sync per chunk
        self.comm.all_reduce(flag, "all_reduce_norm")
        total, failed, any_arrived = flag.tolist()
        if closure_err is not None and len(errs) == 1:
            raise closure_err   # (this rank's own exception, after the step's collectives)
        if errs:
            raise RuntimeError("ShardedOptimizer.step: " + "; ".join(errs))
        if failed:
            raise L.remote_error("ShardedOptimizer.step (another rank failed)")
        if not any_arrived:
            return loss     # no rank wrote a gradient: nothing moves (as torch.optim with every .grad None)
        norm = math.sqrt(total)
        self.last_grad_norm = norm
        if self.max_grad_norm is not None:
            coef = self.max_grad_norm / (norm + 1e-6)
            if coef < 1.0:
                for g in shards:
                    g.mul_(coef)
        local, remote = [], []
        try:
            for v, (b, lo, hi, _) in zip(self._views, self._view_at):
                v.grad = shards[b][lo:hi]
            self.inner.step()
            self.steps += 1
        except Exception as e:  # noqa: BLE001 - the writebacks tell the others
            local.append(e)
        finally:
            self._hold_view_grads()   # (the shards, upcast ones included, are step()'s alone)
        self._writeback_and_gather(local, remote)
        if local:
            raise local[0]
        if remote:
            raise remote[0]
        return loss

    def _hold_view_grads(self):
        for v, h in zip(self._views, self._view_held):
            v.grad = h

    def _check_not_fsdp(self):
        """Local: no module of the model became an FSDP2 module (fully_shard) and no parameter a
        DTensor since the optimizer took the model over. Returns error strings."""
        ref = getattr(self, "_model_ref", None)
        model = ref() if ref is not None else None
        if model is None:
            return []
        mods, params = fsdp_touched(model)
        if not mods and not params:
            return []
        what = "; ".join(x for x in (f"FSDP2 modules: {names_shown(mods)}" if mods else "",
                                     f"DTensor parameters: {names_shown(params)}" if params else "") if x)
        return [f"{_FSDP_ADVICE} fully_shard was applied to the model after ShardedOptimizer took it over ({what}); "
                f"the two shard the same masters two ways, and FSDP2's sharded parameters are not the tensors "
                f"ShardedOptimizer steps, so training would silently diverge. To use FSDP2, build the model "
                f"again (convert(), then fully_shard) with a torch.optim optimizer over model.parameters(); to use "
                f"ShardedOptimizer, do not call fully_shard on its model"]

    # ---- the model's weights ------------------------------------------------------------

    def masters_from_model(self):
        """Collective (every rank): the model's current weights become the fp32
        masters (a quantized weight's master becomes its row plane dequantized
        to fp32, a dense parameter's its value in fp32), then one writeback.
        Call it right after model.load_state_dict() (or any in-place write into
        the weights) to train on from what was loaded: it replaces the fp32
        masters by the model's lower-precision values (model_from_masters()
        is the call that keeps them). The inner optimizer's state (moments,
        step counts) is kept."""
        self._check_open("masters_from_model")
        errs = self._check_storage(written=False)
        err = RuntimeError("ShardedOptimizer.masters_from_model: " + "; ".join(errs)) if errs else None
        try:
            self._status_then_writeback(err, "masters_from_model", self._seed_masters)
        finally:
            err = None

    def model_from_masters(self):
        """Collective (every rank): write every weight from the masters now
        (what the next step() would do), undoing writes into the model since
        the last writeback, e.g. after evaluating with EMA weights loaded by
        model.load_state_dict()."""
        self._check_open("model_from_masters")
        errs = self._check_storage(written=False)
        err = RuntimeError("ShardedOptimizer.model_from_masters: " + "; ".join(errs)) if errs else None
        try:
            self._status_then_writeback(err, "model_from_masters")
        finally:
            err = None

    def _check_open(self, where):
        if getattr(self, "_closed", False):
            raise RuntimeError(f"ShardedOptimizer.{where}: the optimizer was closed")
        if compat.called_from_dcp_state_dict():
            raise compat.dcp_error()

    # ---- checkpoints -------------------------------------------------------------------

    def state_dict(self):
        """This rank's part: {"format", "world", "rank", "fingerprint", "step",
        "buckets": [master shard clones], "inner": the inner state (clones)}.
        Not torch.optim's form (the parameters are shards of the masters):
        torch.distributed.checkpoint.state_dict's helpers raise."""
        if compat.called_from_dcp_state_dict():
            raise compat.dcp_error()
        return {"format": FORMAT, "world": self.world, "rank": self.rank, "fingerprint": self.fingerprint,
                "config": LY.describe(self.plan), "step": self.steps, "buckets": [b.master.detach().clone() for b in self._buckets],
                "inner": _clone_tree(self.inner.state_dict())}

    def load_state_dict(self, state_dict):
        """Load a state_dict() of the same world size, rank and configuration,
        then rebuild the primaries and dense parameters from the masters.
        Collective: every rank calls it; a rank whose checks fail makes every
        rank raise before anything is loaded anywhere."""
        self._check_open("load_state_dict")
        sd, err = state_dict, None
        try:
            self._check_state(sd)
        except Exception as e:  # noqa: BLE001 - the group learns of it first
            err = e

        def apply():
            inner_before = _clone_tree(self.inner.state_dict())
            try:
                self.inner.load_state_dict(_clone_tree(sd["inner"]))
            except Exception:
                self.inner.load_state_dict(inner_before)
                raise
            for b, m in zip(self._buckets, sd["buckets"]):
                b.master.copy_(m)
            self.steps = int(sd["step"])
        try:
            self._status_then_writeback(err, "load_state_dict", apply)
        finally:
            err = None

    def _check_state(self, sd):
        if not isinstance(sd, dict) or sd.get("format") != FORMAT:
            raise ValueError(f"load_state_dict: not a {FORMAT} state dict")
        compat.check_state_identity(sd, self.world, self.rank, self.fingerprint, LY.describe(self.plan))
        bs = sd.get("buckets")
        if not isinstance(bs, (list, tuple)) or len(bs) != len(self._buckets):
            raise ValueError(f"load_state_dict: expected {len(self._buckets)} bucket masters")
        for i, (b, m) in enumerate(zip(self._buckets, bs)):
            if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(b.master.shape) or m.dtype != torch.float32:
                raise ValueError(f"load_state_dict: bucket {i} master must be a float32 tensor of "
                                 f"{tuple(b.master.shape)}")
        if not isinstance(sd.get("step"), int) or "inner" not in sd:
            raise ValueError("load_state_dict: missing 'step' or 'inner'")
        compat.check_inner(self, sd["inner"])

    def _inner_params(self):
        """The inner optimizer's parameters in its state_dict() order:
        [(index, group, bucket index, shard lo, shard hi, view)] (each a view
        master[lo:hi] of one bucket's master shard)."""
        at = {id(v): a for v, a in zip(self._views, self._view_at)}
        out = []
        for g, grp in enumerate(self.inner.param_groups):
            for p in grp["params"]:
                b, lo, hi, _ = at[id(p)]
                out.append((len(out), g, b, lo, hi, p))
        return out

    # ---- humans -------------------------------------------------------------------------

    def _release(self):
        """Drop everything that holds on to the process group: every bucket's
        writeback (its gather schedules keep the group), the backward hooks,
        the pending reductions."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for it in self._items:   # the quantized linears' gradient hooks (unless a rollback restored another's)
            m = it.module
            if m is not None and module_owner(m) is self:
                m._mxs_grad_hook = None
                m._mxs_released = True   # (its backward refuses to accumulate for nobody: linear.py)
        for b in self._buckets:
            b.work = None
            for k in ("wb", "nvwb"):
                if getattr(b, k) is not None:
                    getattr(b, k).close()
                    setattr(b, k, None)
            b.gathers = []
        self.comm.group = None
        self.comm.active = False
        self._closed = True

    def close(self):
        """Release what holds on to the process group: every bucket's
        writeback (its gather schedules keep the group), the backward hooks,
        the pending reductions. Call it (or use ``with ShardedOptimizer(...)
        as opt:``) before ``dist.destroy_process_group()``: a group that
        outlives destroy_process_group() inside a live optimizer is torn down
        during interpreter exit, where gloo can abort the process. The model
        keeps its (last written) primaries and dense values; the optimizer
        can not step afterwards."""
        self._release()
        # Reference cycles (ctypes argument arrays, closures) that reach
        # tensors of the collectives are collected now, while the process
        # group is alive, not during interpreter exit.
        gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def buffer_bytes(self):
        """Bytes of this rank's storage by kind."""
        out = Counter()
        for b in self._buckets:
            for k in ("master", "grad") + PLANE_BUFFERS:
                t = getattr(b, k)
                if t is not None:
                    out[k] += t.numel() * t.element_size()
            if not b.shard_is_view:
                out["grad_shard"] += b.grad_shard.numel() * b.grad_shard.element_size()
            for _, _, _, buf in b.dense:
                out["dense"] += buf.numel() * buf.element_size()
        return dict(out)

    def __repr__(self):
        if self.plan is None or self.inner is None:
            return "ShardedOptimizer(<not constructed>)"
        lines = [f"ShardedOptimizer(world={self.world}, rank={self.rank}, {len(self._buckets)} buckets, "
                 f"{len(self._items)} items, inner={type(self.inner).__name__}, steps={self.steps}"]
        for b in self._buckets:
            bs = b.spec
            kinds = Counter(self._items[p.item].kind for p in bs.items)
            lines.append(f"  bucket {bs.index}: {bs.numel} elements (padded {bs.n_pad}, shard {bs.shard}), "
                         + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
        lines.append("  bytes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.buffer_bytes().items())) + ")")
        return "\n".join(lines)
