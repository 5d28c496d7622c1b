# SPDX-License-Identifier: MIT
"""Cases with a real client: tiny Hugging Face transformers causal LMs (built
from a config, random init, no download), converted by mxshard.torch.convert,
trained under FSDP2 on gloo ranks, checkpointed with DCP, exported with
export_safetensors and reloaded into a plain (unconverted) HF model. Run by
every rank of the gloo group test_hf_client.py spawns (torch_harness); the
one-process helpers (ARCHS, build, plain, ...) serve its other tests too.

Imports torch and transformers at the top: test_hf_client.py imports this
module only after its skips (torch, transformers, safetensors, gloo)."""
import os
import zlib

import torch
import torch.distributed as dist
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import torch_harness as H
import mxshard.torch as mxt

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB = 128
STEPS = 3

# name -> (config class, model class, config kwargs, convert policy, convert kwargs). Converted
# linears compute in fp32 here (compute_dtype): the plain model reloaded from the export then
# computes with the same weight values in the same dtype, so logits agree to fp32 rounding.
#   llama: MXFP8, attention "both" (k/v_proj [32, 64]: 16 rows a rank, the col plane's 32-row
#          blocks cut by the shard boundary), MLP row-only; separate lm_head (dense).
#   qwen2: NVFP4 16x16 blocks, every decoder linear row-only (q/k/v with biases; gate/up [72, 64]:
#          36 rows a rank, 16-row blocks cut); lm_head tied to the embedding (both dense).
ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM,
              dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False),
              {"*.mlp.*": "row", "*.self_attn.*": "both"}, dict(format="mxfp8")),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(hidden_size=64, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True),
              {"model.layers.*": "row"}, dict(format="nvfp4", block="16x16")),
}
# the nn.Linear modules convert() swaps: every projection of every decoder layer
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def config(arch):
    cfg_cls, _, kw, _, _ = ARCHS[arch]
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"  # the same attention kernel on every path (plain and converted)
    return cfg


def plain(arch, seed=0):
    """The unconverted HF model, fp32 (the masters' dtype), random init from `seed` (no dropout in
    these configs: train and eval mode compute the same)."""
    _, model_cls, _, _, _ = ARCHS[arch]
    torch.manual_seed(seed)
    return model_cls(config(arch)).to(torch.float32)


def build(arch, seed=0, compute_dtype=torch.float32):
    """plain(arch, seed) converted with the arch's policy (lm_head and embeddings stay dense)."""
    _, _, _, policy, kw = ARCHS[arch]
    return mxt.convert(plain(arch, seed), policy, compute_dtype=compute_dtype, **kw)


def converted_names(model):
    return [n for n, m in model.named_modules() if mxt.is_param_linear(m)]


def tokens(seed, batch=2, seq=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def compare(got, want):
    """Summary of two logits tensors: max |d|, the logits' max |.|, the share of equal argmaxes."""
    return {"max_abs": (got - want).abs().max().item(), "scale": want.abs().max().item(),
            "argmax": (got.argmax(-1) == want.argmax(-1)).float().mean().item()}


# ---- under FSDP2 -----------------------------------------------------------------------

def fsdp(module):
    """fully_shard on an explicit CPU mesh: FSDP2's default mesh is the accelerator's wherever
    one exists (torch_fsdp_cases.fsdp)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    return fully_shard(module, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))


def shard(model):
    """fully_shard every decoder layer, then the root (convert came first)."""
    for layer in model.model.layers:
        fsdp(layer)
    fsdp(model)
    return model


def local_masters(model):
    """{state_dict key: this rank's shard (a plain tensor)}."""
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in model.state_dict().items()}


def digest(sd):
    """A crc32 of the state dict's values: equal on every rank iff every rank built the same model."""
    c = 0
    for k in sorted(sd):
        c = zlib.crc32(sd[k].detach().contiguous().view(torch.uint8).numpy().tobytes(), zlib.crc32(k.encode(), c))
    return c


def expected_buffers(name, module):
    """The file keys export_safetensors writes for converted linear `name` (its docstring)."""
    planes = ("row", "col") if module.spec.planes == "both" else ("row",)
    extra = ("amax",) if module.spec.format == "nvfp4" else ()
    return [f"{name}.{p}_{b}" for p in planes for b in ("data", "scale")] + [f"{name}.{e}" for e in extra]


def train_step(model, opt, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01)


def case_train_export(rank, world, root, arch):
    """One architecture end to end on every rank: build (same seed everywhere: checked), convert,
    shard, STEPS AdamW steps on one token batch (labels = input ids); DCP save (get_state_dict);
    a fresh model of another seed loads it (dcp.load + set_state_dict): the masters and the logits
    equal the saved model's, and a further step keeps both equal (the optimizer state came too);
    the dequantized weights of an unsharded layer (FSDPModule.unshard) and export_safetensors on
    every rank; every rank then loads the file into a plain HF model (load_safetensors): its
    linears hold exactly those dequantized weights, its dense tensors the masters, and its fp32
    logits match the converted model's."""
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                         set_state_dict)
    out = {}
    m = build(arch, seed=0)
    names = converted_names(m)
    digests = [None] * world
    dist.all_gather_object(digests, digest(m.state_dict()))
    out["same_init"] = len(set(digests)) == 1
    shard(m)
    opt = adamw(m)
    ids, eval_ids = tokens(1), tokens(2, batch=3, seq=11)
    out["losses"] = [train_step(m, opt, ids) for _ in range(STEPS)]

    # DCP: the masters are plain (DTensor) tensors of the state dict
    ckpt = os.path.join(root, arch, "ckpt")
    msd, osd = get_state_dict(m, opt)
    out["plain_state"] = not any(isinstance(getattr(v, "_local_tensor", v), mxt.QuantMaster) for v in msd.values())
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    m2 = shard(build(arch, seed=7))        # other initial values: everything must come from the checkpoint
    opt2 = adamw(m2)
    logits(m2, eval_ids)                   # its own bytes exist: the load must replace them
    msd2, osd2 = get_state_dict(m2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(m2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    a, b = local_masters(m), local_masters(m2)
    assert set(a) == set(b), (sorted(a), sorted(b))
    out["masters_loaded"] = sorted(k for k in a if not torch.equal(a[k], b[k])) or "equal"
    out["logits_loaded"] = compare(logits(m2, eval_ids), logits(m, eval_ids))["max_abs"]

    # what the forward multiplies by, with every layer unsharded (a collective: every rank)
    deq = {}
    for i, layer in enumerate(m.model.layers):
        layer.unshard()
        for p in PROJ:
            deq[f"model.layers.{i}.{p}"] = mxt.dequantized_weight(layer.get_submodule(p)).clone()
        layer.reshard()
    out["deq_names"] = sorted(deq) == sorted(names)

    # export (every rank calls it; rank 0 writes), then the plain model on every rank
    path = os.path.join(root, arch, "export.safetensors")
    mxt.export_safetensors(path, m)
    full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))  # on every rank (CPU)
    want = logits(m, eval_ids)
    dist.barrier()
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
    out["file_masters"] = sorted(f"{n}.weight" for n in names if f"{n}.weight" in keys)
    out["file_missing_bytes"] = sorted(k for n in names for k in expected_buffers(n, m.get_submodule(n))
                                       if k not in keys)
    p = plain(arch, seed=11)
    missing, unexpected = mxt.load_safetensors(path, p)
    out["load_keys"] = (list(missing), list(unexpected))
    psd = p.state_dict()
    out["plain_is_deq"] = sorted(n for n in names if not torch.equal(psd[f"{n}.weight"], deq[n])) or "equal"
    dense = [k for k in full if k not in {f"{n}.weight" for n in names}]   # converted linears' biases too
    out["dense_checked"] = (len(dense), len(psd) - len(names))
    out["dense_equal"] = sorted(k for k in dense if not torch.equal(psd[k], full[k])) or "equal"
    out["tied"] = p.lm_head.weight is p.model.embed_tokens.weight
    out["logits"] = compare(logits(p, eval_ids), want)

    # one step more on the saved and the loaded model: still equal
    l1, l2 = train_step(m, opt, ids), train_step(m2, opt2, ids)
    a, b = local_masters(m), local_masters(m2)
    out["continued"] = (l1 == l2) and all(torch.equal(a[k], b[k]) for k in a)
    out["losses"].append(l1)
    return out


CASES = {"train_export": case_train_export}


def plan(root):
    return [(arch, "train_export", {"root": root, "arch": arch}) for arch in ARCHS]


def worker(rank, world, port, q, plan=None):
    H.run_rank(rank, world, port, q, plan, CASES, gloo_timeout=60, timed=True)


if os.environ.get(H.WARM_UP_VAR) == "1":
    torch.set_num_threads(1)
