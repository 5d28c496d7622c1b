# SPDX-License-Identifier: MIT
"""convert(model, policy): swap a model's nn.Linear modules for quantized ones.

    convert(model, "row")                                   MXFP8ParamLinear
    convert(model, {"*.mlp.*": "row"}, format="nvfp4")      NVFP4ParamLinear
    convert(model, {"*.mlp.*": "row", "*.qkv": "both"})     per module

One converted linear for every training loop: its `weight` is an
nn.Parameter holding the master, the quantized primary is derived from it.
The same model then trains in one process under any torch.optim optimizer,
under FSDP2 (fully_shard), or under ShardedOptimizer (which takes the
linears' storage over at its construction, mxshard.torch.zero.adopt).
`fsdp=` is accepted and ignored (a DeprecationWarning): both of its values
used to select one of two module kinds.

One decision per module (policy, skip), every check before the first swap.
"""
from __future__ import annotations

import fnmatch
import warnings
import weakref

import torch
import torch.nn as nn

from .. import formats as _formats
from .fsdp.group import FSDPGroup
from .fsdp.linear import _ParamLinear, make_spec, param_linear_class
from .options import _LAYOUTS, _check_choice, _check_compute_dtype, _check_device, _require_library

__all__ = ["convert"]

_POLICY_VALUES = ("row", "both", "dense")
_ROUND_THROUGH = {"bf16": "bf16", None: "none"}


def _check_policy_value(v, where):
    if v not in _POLICY_VALUES:
        raise ValueError(f"convert: {where} gave {v!r}; expected 'row', 'both' or 'dense'")
    return v


def _policy_fn(policy):
    """policy -> (a function (name, module) -> 'row' | 'both' | 'dense' (validated), the dict
    patterns or ())."""
    if isinstance(policy, str):
        _check_policy_value(policy, "policy")
        return (lambda name, mod: policy), ()
    if isinstance(policy, dict):
        items = list(policy.items())
        for k, v in items:
            if not isinstance(k, str):
                raise ValueError(f"convert: policy pattern {k!r} is not a string")
            _check_policy_value(v, f"policy[{k!r}]")

        def by_pattern(name, mod):
            for k, v in items:
                if fnmatch.fnmatchcase(name, k):
                    return v
            return "dense"
        return by_pattern, tuple(k for k, _ in items)
    if callable(policy):
        def by_call(name, mod):
            v = policy(name, mod)
            return "dense" if v is None else _check_policy_value(v, f"policy({name!r})")
        return by_call, ()
    raise ValueError(f"convert: policy must be 'row', 'both', 'dense', a dict of fnmatch patterns or a "
                     f"callable, got {type(policy).__name__}")


def _skip_patterns(skip):
    if skip is None:
        return ()
    pats = (skip,) if isinstance(skip, str) else tuple(skip)
    for p in pats:
        if not isinstance(p, str):
            raise ValueError(f"convert: skip pattern {p!r} is not a string")
    return pats


def _skip_matches(name, pattern):
    """A skip pattern names a linear, or a module whose linears it leaves dense all ("blk" as "blk.*")."""
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")


def _skipped(name, skips):
    return any(_skip_matches(name, p) for p in skips)


def _format_options(format, rounding, block):
    """convert's format options -> (the Format, rounding, block): the format's own option (rounding
    for MXFP8, block for NVFP4) checked against its choices, the other one None (giving it is a
    ValueError that names the format it belongs to)."""
    fmt = format if isinstance(format, _formats.Format) else \
        _formats.get(_check_choice("format", format, _formats.NAMES, "convert"))
    given = {"rounding": rounding, "block": block}
    for opt, v in given.items():
        if opt != fmt.option and v is not None:
            owner = next(f for f in _formats.ALL if f.option == opt)
            raise ValueError(f"convert: {opt}={v!r} applies to format={owner.name!r} only ({fmt.fixed_note})")
    own = given[fmt.option]
    given[fmt.option] = _check_choice(fmt.option, fmt.option_choices[0] if own is None else own, fmt.option_choices,
                                      "convert")
    return fmt, given["rounding"], given["block"]


def _unmatched_message(kind, pats, names, conv1d=(), others=None, batched=None):
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "") if names else "none"
    # a pattern naming weights stored batched ([E, out, in]: a mixture of experts' experts in one tensor)
    hit = [(n, shape) for n, shape in (batched or {}).items()
           if any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(n.rpartition(".")[0], p) for p in pats)]
    if hit:
        what = ", ".join(f"{n} {list(shape)}" for n, shape in hit[:4]) + (", ..." if len(hit) > 4 else "")
        return (f"convert: keep batched weights dense (leave them out of the policy, or pass strict=False), or split "
                f"them into nn.Linear modules to convert them: {kind} {', '.join(map(repr, pats))} name"
                f"{'s' if len(pats) == 1 else ''} weights stored as one tensor per group ({what}: experts in one "
                f"Parameter), which convert() cannot quantize; it converts nn.Linear modules (the model's: {shown})")
    # a pattern naming subclasses of nn.Linear (a LazyLinear not yet materialised, a class of the model's own)
    hit = {n: c for n, c in (others or {}).items() if any(fnmatch.fnmatchcase(n, p) for p in pats)}
    if hit:
        what = ", ".join(f"{n} ({c})" for n, c in list(hit.items())[:4]) + (", ..." if len(hit) > 4 else "")
        return (f"convert: {kind} {', '.join(map(repr, pats))} name{'s' if len(pats) == 1 else ''} subclasses of "
                f"nn.Linear, which convert() leaves dense ({what}): it converts exact nn.Linear modules (run one "
                f"forward first to materialise a LazyLinear), or pass strict=False to leave them dense (the model's "
                f"nn.Linear modules: {shown})")
    # a pattern naming Hugging Face Conv1D modules (GPT-2's transposed linears) is right, the modules are not
    on_conv1d = [p for p in pats if any(fnmatch.fnmatchcase(n, p) for n in conv1d)]
    if on_conv1d:
        hit = [n for n in conv1d if any(fnmatch.fnmatchcase(n, p) for p in on_conv1d)]
        more = f", ... ({len(hit)} in all)" if len(hit) > 4 else ""
        return (f"convert: {kind} {', '.join(map(repr, on_conv1d))} name{'s' if len(on_conv1d) == 1 else ''} "
                f"Hugging Face Conv1D modules, which convert() cannot convert ({', '.join(hit[:4])}{more}: GPT-2's "
                f"transposed linears, weight [in, out]); convert nn.Linear modules only, or pass strict=False to "
                f"leave them dense (the model's nn.Linear modules: {shown})")
    return (f"convert: {kind} {', '.join(map(repr, pats))} match{'es' if len(pats) == 1 else ''} no nn.Linear of the "
            f"model (its nn.Linear modules: {shown}); fix the pattern, or pass strict=False to allow it")


def _spec_text(spec, other=None):
    """'MXFP8 'row'' (and the options where they differ from `other`'s spec)."""
    text = f"{spec.format.upper()} {spec.planes!r}"
    if other is not None:
        extra = [f"{f}={getattr(spec, f)!r}" for f in ("layout", "rounding", "block", "compute_dtype", "round_through")
                 if getattr(spec, f) != getattr(other, f)]
        text += f" ({', '.join(extra)})" if extra else ""
    return text


def _already_converted_message(done, detail):
    by_spec = {}
    for n, m in done:
        by_spec.setdefault(_spec_text(m.spec), []).append(n or "<root>")
    shown = "; ".join(f"{', '.join(ns[:6])}{', ...' if len(ns) > 6 else ''}: {sp}" for sp, ns in by_spec.items())
    return (f"convert: the model is already converted ({shown}); convert a model once, from its plain nn.Linear "
            f"modules (build a fresh model, or load its state dict into one, and convert that with the policy you "
            f"want). {detail}")


def _group_of(model):
    """The FSDPGroup of a model that convert() already touched (one per model), or a new one; its
    `root` (weakly held) is the model convert() was given."""
    g = next((m._group for m in model.modules() if isinstance(m, _ParamLinear)), None) or FSDPGroup()
    g.root = weakref.ref(model)
    return g


def _transposed_linears(model):
    """{qualified name: module} of the model's Hugging Face transformers Conv1D modules (GPT-2's
    linears, weight stored [in, out]): convert leaves them dense and says so."""
    return {n: m for n, m in model.named_modules()
            if type(m).__name__ == "Conv1D" and hasattr(m, "nf") and getattr(m, "weight", None) is not None}


def _refuse_ddp(model):
    from torch.nn.parallel import DistributedDataParallel
    if any(isinstance(m, DistributedDataParallel) for m in model.modules()):
        raise ValueError("convert: convert the model before wrapping it in DistributedDataParallel "
                         "(DDP(convert(model, ...))): DDP's reducer holds the nn.Linear weights convert() "
                         "replaces, so the converted weights' gradients would never be averaged")


def _reparametrized_names(model):
    from torch.nn.utils import parametrize
    return [n for n, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, nn.Linear) and parametrize.is_parametrized(m, "weight")]


def _refuse_reparametrized(model, skips, decide):
    """A parametrized nn.Linear (torch.nn.utils.parametrize: its class becomes ParametrizedLinear)
    that the policy selects would stay dense without a word."""
    for n in _reparametrized_names(model):
        m = model.get_submodule(n)
        if not _skipped(n, skips) and decide(n, m) != "dense":
            raise ValueError(f"convert: remove the parametrization of {n or '<root>'}.weight first "
                             f"(torch.nn.utils.parametrize.remove_parametrizations), or keep {n or '<root>'} "
                             f"dense (skip=[{n or '<root>'!r}]): a parametrized linear computes its weight, "
                             f"which convert cannot hold as a quantized master")


def _is_dtensor(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without torch.distributed
        return False
    return isinstance(t, DTensor)


def convert(model, policy="row", *, format="mxfp8", layout="padded", compute_dtype=torch.bfloat16, rounding=None,
            block=None, skip=None, fsdp=None, round_through="bf16", strict=True):
    """Swaps the nn.Linear submodules of `model` in place for quantized linears.

    policy: 'row' | 'both' | 'dense' for all; a dict {fnmatch pattern on the qualified module
    name: value} (first match wins, unmatched -> dense); or a callable (name, module) -> value
    or None (dense). skip: fnmatch pattern(s) of qualified names that stay dense whatever the
    policy says (a module's name leaves all of its linears dense: "blk" as "blk.*"). Only exact
    nn.Linear instances are candidates (subclasses such as MultiheadAttention's out_proj, whose
    weight is read directly, are left alone). A weight
    shared with another module (tied) cannot be converted: ValueError. strict (default True): a
    dict pattern or skip pattern that matches no nn.Linear, or a policy that converts nothing,
    is a ValueError (a typo would otherwise train the model dense without a word); strict=False
    allows it. Everything is decided and checked before the first swap. Returns the model (the
    new module when `model` itself is a converted nn.Linear).

    Every converted linear is an MXFP8ParamLinear / NVFP4ParamLinear: an nn.Linear subclass
    whose `weight` is an nn.Parameter holding the master (the linear's own values and dtype),
    for any torch.optim optimizer, FSDP2 `fully_shard` (convert first, then shard), DCP and
    ShardedOptimizer alike; round_through ('bf16', TE's master cast, or None) is how the master
    is rounded before quantizing. fsdp= is ignored (DeprecationWarning). Hugging Face
    transformers' Conv1D modules (GPT-2's transposed linears) are not converted: a policy that
    would convert one is a ValueError under strict (a warning with strict=False).

    format: 'mxfp8' (default) or 'nvfp4', or the value mxshard.formats.MXFP8 / NVFP4.
    Format options: rounding ('ceil' by default, or 'floor') is MXFP8's, block ('1x16' by
    default, or '16x16') NVFP4's; giving the other format's option is a ValueError. layout and
    compute_dtype apply to both. One call converts to one format; for a model of both, call
    convert twice (the second call sees only the nn.Linear modules the first one left dense).

    A module converts once: a policy that selects a linear this call's format already converted
    with another spec (planes or options) is a ValueError ("the model is already converted"), and
    so is, under strict, a call that finds every selected linear converted already."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert: model must be an nn.Module, got {type(model).__name__}")
    decide, pol_pats = _policy_fn(policy)
    skips = _skip_patterns(skip)
    fmt, rounding, block = _format_options(format, rounding, block)
    _check_choice("layout", layout, _LAYOUTS, "convert")
    _check_compute_dtype(compute_dtype, "convert")
    if fsdp is not None:
        if not isinstance(fsdp, bool):
            raise TypeError(f"convert: fsdp must be a bool, got {type(fsdp).__name__}")
        warnings.warn("convert: drop fsdp=: it is ignored. Every converted linear now serves every training "
                      "loop (torch.optim, fully_shard, ShardedOptimizer)", DeprecationWarning, stacklevel=2)
    if round_through not in _ROUND_THROUGH:
        raise ValueError(f"convert: round_through={round_through!r} is not 'bf16' or None")
    _refuse_ddp(model)
    # a module reachable under several names is converted once and set at every name
    names = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        if type(mod) is nn.Linear:
            names.setdefault(id(mod), (mod, []))[1].append(name)
    all_names = [n for _, ns in names.values() for n in ns]
    conv1d_all = _transposed_linears(model)
    done = [(n, m) for n, m in model.named_modules(remove_duplicate=False) if isinstance(m, _ParamLinear)]
    if strict:
        # (a skip pattern may name Conv1D modules: that is how they are left dense on purpose)
        # (a pattern naming a converted linear is checked below: "already converted")
        done_names = [n for n, _ in done]
        for kind, pats, among in (("policy pattern", pol_pats, all_names + done_names),
                                  ("skip pattern", skips, all_names + done_names + list(conv1d_all)
                                   + _reparametrized_names(model))):
            match = _skip_matches if kind == "skip pattern" else fnmatch.fnmatchcase
            bad = [p for p in pats if not any(match(n, p) for n in among)]
            if bad:
                others = {n: type(m).__name__ for n, m in model.named_modules(remove_duplicate=False)
                          if isinstance(m, nn.Linear) and type(m) is not nn.Linear and not isinstance(m, _ParamLinear)}
                batched = {f"{mn}.{pn}" if mn else pn: tuple(p.shape)
                           for mn, mod in model.named_modules() for pn, p in mod._parameters.items()
                           if p is not None and not isinstance(p, nn.parameter.UninitializedParameter)
                           and p.dim() >= 3}
                raise ValueError(_unmatched_message(kind + ("s" if len(bad) > 1 else ""), bad, all_names,
                                                    list(conv1d_all), others, batched))
    _refuse_reparametrized(model, skips, decide)
    uses = {}  # parameter -> how many distinct modules own it
    for mod in model.modules():
        for p in mod._parameters.values():
            if p is not None:
                uses[id(p)] = uses.get(id(p), 0) + 1
    todo = []
    for mod, mod_names in names.values():
        vals = {"dense" if _skipped(n, skips) else decide(n, mod) for n in mod_names}
        if len(vals) > 1:
            raise ValueError(f"convert: give the module shared as {', '.join(mod_names)} one policy (a pattern, or "
                             f"skip=, that matches all its names alike): its names get different policies "
                             f"({', '.join(sorted(vals))})")
        v = vals.pop()
        if v == "dense":
            continue
        if "weight" not in mod._parameters:
            who = mod_names[0] or '<root>'
            raise ValueError(f"convert: remove what replaced {who}.weight by a computed tensor first "
                             f"(torch.nn.utils.prune.remove, remove_weight_norm, remove_spectral_norm), or keep "
                             f"{who} dense (skip=[{who!r}]): its weight is no Parameter (it holds "
                             f"{', '.join(mod._parameters) or 'no parameters'}), and convert would quantize "
                             f"the computed value and drop the mask / norm silently")
        if uses.get(id(mod.weight), 0) > 1:
            who = mod_names[0] or '<root>'
            raise ValueError(f"convert: keep {who} dense (leave it out of the policy, or skip=[{who!r}]): its "
                             f"weight is shared with another module (tied)")
        if _is_dtensor(mod.weight):
            raise ValueError(f"convert: call convert(model, ...) before fully_shard: {mod_names[0] or '<root>'}"
                             f".weight is already sharded (a DTensor)")
        if mod.weight.device.type != "meta":  # a model built on meta (torchtitan): to_empty() later
            _require_library(_check_device(mod.weight.device, "convert"), "convert")
        todo.append((mod, mod_names, v))
    # converted linears the policy selects: the same spec is already done (a no-op); another spec of this
    # call's format is a second conversion of one module, which convert cannot do (the first one rounded
    # the master). Linears of another format belong to an earlier call that made the other format of a
    # two-format model: this call sees only the plain nn.Linear modules, as documented.
    selected, clash = [], []
    for n, m in done:
        v = "dense" if _skipped(n, skips) else decide(n, m)
        if v == "dense":
            continue
        selected.append(n)
        if m.spec.format != fmt.name:
            continue
        want = make_spec(fmt, v, layout, rounding, block, compute_dtype, _ROUND_THROUGH[round_through])
        if want != m.spec:
            clash.append(f"{n or '<root>'} -> {_spec_text(want, m.spec)}")
    if clash:
        raise ValueError(_already_converted_message(
            done, f"This call would convert {', '.join(clash[:6])}{', ...' if len(clash) > 6 else ''} again"))
    conv1d = [n for n, m in conv1d_all.items()
              if not _skipped(n, skips) and decide(n, m) != "dense"]
    if conv1d:
        shown = ", ".join(conv1d[:4]) + (f", ... ({len(conv1d)} in all)" if len(conv1d) > 4 else "")
        msg = (f"convert: add the Conv1D modules to skip= (or pass strict=False) to convert the nn.Linear modules "
               f"alone: {shown} are Hugging Face Conv1D modules (GPT-2's transposed linears, weight [in, out]), "
               f"which convert leaves dense")
        if strict:
            raise ValueError(msg)
        warnings.warn(msg, stacklevel=2)
    if strict and not todo and policy != "dense" and selected:
        raise ValueError(_already_converted_message(
            done, "Pass strict=False to allow a call that finds every selected linear converted already"))
    if strict and not todo and policy != "dense":
        raise ValueError(f"convert: the policy converts no nn.Linear of the model (its nn.Linear modules: "
                         f"{', '.join(all_names[:6]) or 'none'}); pass strict=False to allow it")
    group = _group_of(model)
    first = {}
    for n, m in done:   # (a linear an earlier call converted as part of a submodule: named from this root now)
        if m._group is group:
            first.setdefault(m, n)
    group.rename(first)
    cls = param_linear_class(fmt)
    for mod, mod_names, v in todo:
        spec = make_spec(fmt, v, layout, rounding, block, compute_dtype, _ROUND_THROUGH[round_through])
        new = cls.from_linear(mod, spec, mod_names[0], group)
        for name in mod_names:
            if name == "":
                return new
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, new)
    return model


# ---- a converted linear built directly -------------------------------------------------------

class _ConvertedAlias(type):
    """isinstance / issubclass of the alias ask convert()'s class of the format."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls._target())

    def __subclasscheck__(cls, sub):
        return isinstance(sub, type) and issubclass(sub, cls._target())


def _check_built(who, in_features, out_features, bias):
    """What nn.Linear accepts and a quantized weight cannot hold: no rows or columns; a bias that is
    not a bool."""
    from .options import _check_features
    _check_features("in_features", in_features, who)
    _check_features("out_features", out_features, who)
    if not isinstance(bias, bool):
        raise TypeError(f"{who}: pass bias=True or False, got {bias!r}")


class MXFP8Linear(metaclass=_ConvertedAlias):
    """MXFP8Linear(in_features, out_features, bias=True, *, planes="row", layout="padded", device=None,
    compute_dtype=torch.bfloat16, rounding="ceil"): a new nn.Linear converted to MXFP8 (convert()'s
    MXFP8ParamLinear; isinstance(m, MXFP8Linear) is True for every MXFP8 linear convert() made)."""

    @staticmethod
    def _target():
        from .fsdp.linear import MXFP8ParamLinear
        return MXFP8ParamLinear

    def __new__(cls, in_features, out_features, bias=True, *, planes="row", layout="padded", device=None,
                compute_dtype=torch.bfloat16, rounding="ceil"):
        _check_built("MXFP8Linear", in_features, out_features, bias)
        return convert(nn.Linear(in_features, out_features, bias=bias, device=device), planes, format="mxfp8",
                       layout=layout, compute_dtype=compute_dtype, rounding=rounding)


class NVFP4Linear(metaclass=_ConvertedAlias):
    """NVFP4Linear(in_features, out_features, bias=True, *, planes="row", block="1x16", layout="padded",
    device=None, compute_dtype=torch.bfloat16): a new nn.Linear converted to NVFP4 (convert()'s
    NVFP4ParamLinear)."""

    @staticmethod
    def _target():
        from .fsdp.linear import NVFP4ParamLinear
        return NVFP4ParamLinear

    def __new__(cls, in_features, out_features, bias=True, *, planes="row", block="1x16", layout="padded",
                device=None, compute_dtype=torch.bfloat16):
        _check_built("NVFP4Linear", in_features, out_features, bias)
        return convert(nn.Linear(in_features, out_features, bias=bias, device=device), planes, format="nvfp4",
                       layout=layout, compute_dtype=compute_dtype, block=block)
