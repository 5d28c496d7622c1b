# SPDX-License-Identifier: MIT
"""convert() and the converted linear against the habits of a PyTorch user (one process): the
order of convert and the optimizer, handles kept on the replaced nn.Linear, loads and exports
that cannot do what was asked, and the messages that say what to do instead."""
import copy

import pytest

from conftest import torch_lib_or_skip

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import mxshard  # noqa: E402
import mxshard.torch as mxt  # noqa: E402
from converted_checks import bytes_fresh as fresh  # noqa: E402


@pytest.fixture(autouse=True)
def _lib():
    torch_lib_or_skip()


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 8))


def test_an_optimizer_built_before_convert_raises_at_its_step():
    """AdamW(model.parameters()) then convert(model): the optimizer holds the replaced weights and
    would train nothing of the converted linears (their weights stayed at their initial values,
    silently); its step raises, nothing moved. Built after convert, it trains every weight."""
    m = net()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    mxt.convert(m, "row")
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}
    m(torch.randn(4, 32)).pow(2).sum().backward()
    with pytest.raises(RuntimeError, match=r"^mxshard: build the optimizer after convert\(\) \(over "
                                           r"model.parameters\(\) then\): it holds the weights convert\(\) replaced "
                                           r"\(0.weight, 2.weight"):
        opt.step()
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt.step()
    assert all(not torch.equal(v, before[k]) for k, v in m.state_dict().items())


def test_the_replaced_linear_lets_go_of_the_weight():
    """The nn.Linear convert() replaced (a handle kept on it, or the root linear whose converted
    twin convert() returns) no longer shares the master's storage: a write through it changed the
    master unseen (another version counter) and the bytes went stale. Its forward says to use the
    module convert() returned, also when torch.compile traced it before convert() (the recompiled
    call ran F.linear on the released weight: torch's "mat2 must be a matrix")."""
    lin = nn.Linear(32, 8)
    keep = lin.weight.detach().clone()
    compiled = torch.compile(lin, backend="eager")
    compiled(torch.randn(2, 32))
    new = mxt.convert(lin, "row")
    assert lin.weight.numel() == 0 and torch.equal(new.weight.detach()._data, keep)
    for call in (lin, compiled):
        with pytest.raises(RuntimeError, match=r"^mxshard: call the module convert\(\) returned, or the model it "
                                               r"converted"):
            call(torch.randn(2, 32))
    m = net()
    old = m[0]
    mxt.convert(m, "row")
    assert old.weight.numel() == 0 and m[0].weight.shape == (48, 32)


def test_values_taken_out_of_a_weight_quantize_and_convert_to_numpy():
    """mxshard.quantize of w.detach() / a clone / a bf16 copy of a converted weight (they stay the
    weight's tensor subclass, with no data pointer of their own: "a required pointer is NULL") and
    w.detach().cpu().numpy() (refused by torch for subclasses) work on the master's values."""
    m = mxt.convert(net(), "row")
    w = m[0].weight
    plain = w.detach()._data
    want = mxshard.quantize(mxshard.MXFP8Weight.empty(48, 32, planes="row", layout="compact", device="cpu"), plain)
    for src in (w.detach(), w.detach().clone(), w.data):
        got = mxshard.quantize(mxshard.MXFP8Weight.empty(48, 32, planes="row", layout="compact", device="cpu"), src)
        assert torch.equal(got.row_data.view(torch.uint8), want.row_data.view(torch.uint8))
    a = w.detach().cpu().numpy()
    assert a.shape == (48, 32) and (a == plain.numpy()).all()


@pytest.mark.parametrize("other", [{"format": "nvfp4"}, {"layout": "swizzled"}, {"policy": "both"}])
def test_load_safetensors_into_a_converted_model_of_other_options_raises(other, tmp_path):
    """A file exported from an MXFP8 "row" compact model loads into a convert()ed model of another
    format, layout or planes: it requantized the file's values by the model's spec silently (the
    docs promised CheckpointMismatchError); it raises now, naming the difference, nothing loaded.
    The same options load, and the forward equals the exporter's."""
    pytest.importorskip("safetensors")
    src = mxt.convert(net(), "row", layout="compact")
    path = tmp_path / "m.safetensors"
    mxt.export_safetensors(path, src)
    opts = dict(other)
    dst = mxt.convert(net(seed=1), opts.pop("policy", "row"), **{"layout": "compact", **opts})
    before = {k: v.detach().clone() for k, v in dst.state_dict().items()}
    with pytest.raises(mxt.CheckpointMismatchError, match=r"^load_safetensors: 0: the file's quantized weight has "):
        mxt.load_safetensors(path, dst)
    assert all(torch.equal(v, before[k]) for k, v in dst.state_dict().items())
    same = mxt.convert(net(seed=1), "row", layout="compact")
    mxt.load_safetensors(path, same)
    x = torch.randn(3, 32)
    assert torch.equal(same(x), src(x))


@pytest.mark.parametrize("where", ["a directory", "a missing directory"])
def test_export_to_a_path_that_cannot_be_written_raises_before_anything(where, tmp_path):
    """export_safetensors to a directory, or into one that does not exist: every rank checks the
    path first (rank 0 alone raised, after the gather, and the other ranks returned as if it had
    written), and no temporary file is left."""
    pytest.importorskip("safetensors")
    m = mxt.convert(net(), "row")
    p = tmp_path if where == "a directory" else tmp_path / "nope" / "m.safetensors"
    with pytest.raises((IsADirectoryError, FileNotFoundError),
                       match=r"^export_safetensors: (give a file path|create the directory)"):
        mxt.export_safetensors(p, m)
    assert not (tmp_path.parent / (tmp_path.name + ".tmp")).exists() and sorted(tmp_path.iterdir()) == []


def test_messages_say_what_to_do_first():
    """A model on the meta device (materialise it), an integer input (a floating-point one), a
    float64 linear (cast the model), a pattern naming nn.Linear subclasses (convert exact
    nn.Linear), a shared linear whose names get two policies (one policy)."""
    with torch.device("meta"):
        m = net()
    mxt.convert(m, "row")
    with pytest.raises(ValueError, match=r"materialise the model first \(model.to_empty\(device=...\)"):
        m(torch.randn(2, 32, device="meta"))
    m = mxt.convert(net(), "row")
    with pytest.raises(ValueError, match=r"^MXFP8ParamLinear.*: pass a floating-point input \(x.float\(\)"):
        m(torch.ones(2, 32, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^convert: cast the model to float32 or bfloat16 first \(model.float\(\)\): "
                                         r"0.weight is torch.float64"):
        mxt.convert(net().double(), "row")

    class MyLinear(nn.Linear):
        pass
    odd = nn.Sequential(MyLinear(4, 4), nn.LazyLinear(8), nn.Linear(8, 8))
    for name, cls in (("0", "MyLinear"), ("1", "LazyLinear")):
        with pytest.raises(ValueError, match=rf"^convert: policy pattern '{name}' names subclasses of nn.Linear, "
                                             rf"which convert\(\) leaves dense \({name} \({cls}\)\)"):
            mxt.convert(copy.deepcopy(odd), {name: "row"})
    shared = nn.Linear(8, 8)
    two = nn.ModuleDict({"a": shared, "b": shared})
    with pytest.raises(ValueError, match=r"^convert: give the module shared as a, b one policy"):
        mxt.convert(two, {"a": "row"})


WRITES = {
    "w[0].zero_()": lambda w: w[0].zero_(),
    "w[:, 0].fill_(3)": lambda w: w[:, 0].fill_(3.0),
    "w[2] = 7": lambda w: w.__setitem__(2, 7.0),
    "w.view(-1)[5] = 9": lambda w: w.view(-1).__setitem__(5, 9.0),
    "w.data[0].zero_()": lambda w: w.data[0].zero_(),
    "w.detach()[1].fill_(4)": lambda w: w.detach()[1].fill_(4.0),
    "w.unbind(0)[0].zero_()": lambda w: w.unbind(0)[0].zero_(),
    "w.diagonal().fill_(1)": lambda w: w.diagonal().fill_(1.0),
    "w.chunk(2)[1].zero_()": lambda w: w.chunk(2)[1].zero_(),
}


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_writes_through_any_view_of_a_weight_reach_its_bytes(fmt, write):
    """A write through a select / unbind / diagonal / chunk view of a converted weight, after a
    forward made its bytes: the next forward multiplies by the quantize of the written master
    (these views came back as plain tensors, whose writes went unseen: the forward kept the old
    bytes until the next optimizer step)."""
    m = mxt.convert(net(), "row", format=fmt)
    x = torch.randn(3, 32)
    m(x)
    with torch.no_grad():
        WRITES[write](m[0].weight)
    got = mxt.dequantized_weight(m[0])
    twin = mxt.convert(net(), "row", format=fmt)
    with torch.no_grad():
        twin[0].weight.copy_(m[0].weight.detach()._data)
    assert torch.equal(got, mxt.dequantized_weight(twin[0])) and torch.equal(m(x), twin(x))


def test_a_shared_memory_master_written_by_another_process_reaches_the_bytes():
    """Hogwild: share_memory(), a forward here, then another process trains the shared masters:
    this process's next forward uses them (it kept the bytes it had made: its version counters and
    write counts do not see another process's writes)."""
    mp = torch.multiprocessing.get_context("fork")
    m = mxt.convert(net(), "row")
    m.share_memory()
    x = torch.randn(3, 32)
    before = m(x)

    def child():
        with torch.no_grad():
            m[0].weight.mul_(-2.0)
    p = mp.Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 0
    twin = mxt.convert(net(), "row")
    with torch.no_grad():
        twin[0].weight.copy_(m[0].weight.detach()._data)
    after = m(x)
    assert not torch.equal(after, before) and torch.equal(after, twin(x))


def test_gradient_hooks_on_a_converted_weight_are_refused_by_sharded_optimizer():
    """register_hook / register_post_accumulate_grad_hook on a converted weight, then
    ShardedOptimizer: refused at construction, the model left as it was (the hooks were dropped,
    silently: a halving hook changed nothing). Under torch.optim they run (one process)."""
    for register in (lambda w: w.register_hook(lambda g: g * 0.5),
                     lambda w: w.register_post_accumulate_grad_hook(lambda p: None)):
        m = mxt.convert(net(), "row")
        register(m[0].weight)
        with pytest.raises(ValueError, match=r"^ShardedOptimizer: remove the gradient hooks registered on 0.weight"):
            mxt.ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1))
        assert mxt.is_param_linear(m[0])
    m = mxt.convert(net(), "row")
    m[0].weight.register_hook(lambda g: g * 0.5)
    m(torch.ones(2, 32)).sum().backward()
    half = m[0].weight.grad.clone()
    m = mxt.convert(net(), "row")
    m(torch.ones(2, 32)).sum().backward()
    assert torch.equal(half, m[0].weight.grad * 0.5)


def test_torch_jit_script_says_what_to_use():
    """torch.jit.script of a converted model (or of ShardedOptimizer's) names torch.compile /
    torch.export / jit.trace (it raised TorchScript's own "Expected a single top-level function");
    jit.trace works."""
    m = mxt.convert(net(), "row")
    with pytest.raises(RuntimeError, match=r"^mxshard: use torch.compile or torch.export \(or torch.jit.trace\) for "
                                           r"a converted model, or keep 0 dense"):
        torch.jit.script(m)
    x = torch.randn(2, 32)
    with pytest.warns(torch.jit.TracerWarning):
        t = torch.jit.trace(m, x)
    assert torch.equal(t(x), m(x))


def test_skip_naming_a_module_leaves_its_linears_dense():
    """skip=["blk"] (a block's name, as for a module in most tools) was refused as "matches no
    nn.Linear": it leaves every linear under blk dense; a name matching nothing still raises."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.blk = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))

        def forward(self, x):
            return self.blk(self.fc(x))

    m = mxt.convert(Net(), "row", skip=["blk"])
    assert mxt.is_param_linear(m.fc) and all(type(l) is nn.Linear for l in m.blk)
    with pytest.raises(ValueError, match="nope"):
        mxt.convert(Net(), "row", skip=["nope"])


def test_a_copy_of_one_block_holds_its_own_linears_only():
    """copy.deepcopy / torch.save of one converted linear (or block) copied every converted linear
    of the model with it (their group listed them all): torch.save(model[1]) of 4 layers wrote 4
    layers, depth upscaling with deepcopy(layers[-1]) kept hidden copies alive. A copy's group
    lists the copied linears only; a copy of the whole model lists all of them, in order."""
    import io
    m = mxt.convert(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), "row")
    x = torch.randn(3, 64)
    m(x)
    one = copy.deepcopy(m[3])
    assert [(n, mod is one) for n, mod in one._group.members] == [("3", True)]
    assert torch.equal(one(x), m[3](x))
    saved, plain = io.BytesIO(), io.BytesIO()
    torch.save(m[1], saved)
    torch.save(nn.Linear(64, 64), plain)
    assert len(saved.getvalue()) < 1.2 * len(plain.getvalue()), (len(saved.getvalue()), len(plain.getvalue()))
    for twin in (copy.deepcopy(m), torch.load(io.BytesIO(_saved(m)), weights_only=False)):
        assert [(n, mod is twin[int(n)]) for n, mod in twin[0]._group.members] == [(str(i), True) for i in range(4)]
        assert torch.equal(twin(x), m(x))
    assert [n for n, _ in m[0]._group.members] == ["0", "1", "2", "3"]


def _saved(obj):
    import io
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def test_a_model_converted_in_parts_names_each_weight_from_its_root():
    """convert(model.blk), then convert(model): blk.fc1 kept the name "fc1" of the first call's root,
    equal to the model's own fc1, so the two weights shared one unit (each forward made the
    other's bytes again: every forward re-quantized both) and messages named the wrong module."""
    import mxshard.torch.fsdp.units as U

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(32, 32)

        def forward(self, x):
            return self.fc1(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.blk = nn.Linear(32, 32), Block()

        def forward(self, x):
            return self.blk(self.fc1(x))

    torch.manual_seed(0)
    m = Net()
    mxt.convert(m.blk, "row")
    mxt.convert(m, "row")
    assert (m.fc1.meta.name, m.blk.fc1.meta.name) == ("fc1", "blk.fc1")
    assert [n for n, _ in m.fc1._group.members] == ["blk.fc1", "fc1"]
    built, orig = [], U.WeightUnit.__init__

    def counting(self, *a, **k):
        built.append(1)
        orig(self, *a, **k)
    x = torch.randn(3, 32)
    U.WeightUnit.__init__ = counting
    try:
        with torch.no_grad():
            for _ in range(4):
                m(x)
    finally:
        U.WeightUnit.__init__ = orig
    assert len(built) <= 2 and fresh(m.fc1) and fresh(m.blk.fc1)
    with pytest.raises(RuntimeError, match=r"blk\.fc1\.weight"):
        m.blk.fc1.weight @ x.T


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_traced_programs_multiply_by_the_weight_they_are_given(fmt):
    """The custom op of a traced converted linear names its module (the plan) and gets the weight
    as an argument; it multiplied by the module's own master, ignoring the argument: under
    torch.compile, functional_call with a QuantMaster fast weight silently computed with the
    module's weight (eager used the fast one), and a torch.export program whose parameter was
    replaced (load_state_dict(assign=True)) silently kept the old one. Both multiply by the
    quantize of the weight given now, forward and input gradient; the module's own is untouched.
    A program outliving its model says what to do."""
    from torch.func import functional_call
    m = mxt.convert(net(0), "both", format=fmt)
    x = torch.randn(5, 32)
    fast = m[0].weight.detach().clone()
    fast.mul_(2.0)
    params = {"0.weight": fast}
    twin = mxt.convert(net(0), "both", format=fmt)
    with torch.no_grad():
        twin[0].weight.copy_(fast._data)
    own = m(x)
    xe = x.clone().requires_grad_()
    want = twin(xe)
    want.sum().backward()
    f = torch.compile(lambda p, x: functional_call(m, p, (x,)), backend="aot_eager")
    xc = x.clone().requires_grad_()
    got = f(params, xc)
    got.sum().backward()
    assert torch.equal(got, want) and torch.equal(xc.grad, xe.grad)
    assert torch.equal(m(x), own) and torch.equal(functional_call(m, params, (x,)), want)
    m.eval()
    um = torch.export.export(m, (x,)).module()
    assert torch.equal(um(x), own)
    sd = dict(um.state_dict())
    sd["0.weight"] = fast._data.clone()
    um.load_state_dict(sd, assign=True)
    assert torch.equal(um(x), twin(x)) and torch.equal(m(x), own)
    ep = torch.export.export(mxt.convert(net(3), "row", format=fmt), (x,))
    import gc
    gc.collect()
    with pytest.raises(RuntimeError, match=r"^mxshard: keep the converted model alive while a program traced from "
                                           r"it runs"):
        ep.module()(x)


def test_after_close_a_torch_optimizer_cannot_silently_skip_the_converted_weights(tmp_path):
    """ShardedOptimizer.close(), then AdamW(model.parameters()): the linears' weights are the closed
    optimizer's replicated quantized weights (their masters went with it), so AdamW would train
    only biases and norms, silently. The
    backward that would accumulate a converted weight's gradient for nobody raises, saying what to
    do; a gradient for the input alone still works; a new ShardedOptimizer on the model trains it.
    load_checkpoint without a ShardedOptimizer says what to pass."""
    m = mxt.convert(net(), "row")
    opt = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2))
    x = torch.randn(4, 32)
    m(x).pow(2).sum().backward()
    opt.step()
    opt.close()
    deq0 = mxt.dequantized_weight(m[0]).clone()
    torch.optim.AdamW(m.parameters(), lr=1e-2)
    with pytest.raises(RuntimeError, match=r"^mxshard: build a new ShardedOptimizer on the model to train it on"):
        m(x).pow(2).sum().backward()
    assert torch.equal(mxt.dequantized_weight(m[0]), deq0)   # nothing moved
    xi = x.clone().requires_grad_(True)
    gx, = torch.autograd.grad(m(xi).pow(2).sum(), xi)
    assert gx.shape == x.shape
    opt2 = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2))
    # the new optimizer's masters: the closed one's last weights (the row plane dequantized)
    assert torch.equal(opt2.state_dict()["masters"]["0.weight"], deq0)
    before = m[0].weight._box.planes["row"].row_data.clone()
    m(x).pow(2).sum().backward()
    opt2.step()
    assert not torch.equal(m[0].weight._box.planes["row"].row_data, before)
    with pytest.raises(TypeError, match=r"^load_checkpoint: pass the ShardedOptimizer that trains the model"):
        mxt.load_checkpoint(tmp_path, m, None)
    opt2.close()


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_sharded_optimizer_checkpoint_continues_under_torch_optim_exactly(fmt, tmp_path):
    """Trained under ShardedOptimizer (a world of one) and saved with save_checkpoint, the weights go
    into a fresh convert()ed model with load_checkpoint_weights: its masters are bit for bit those
    of the same steps under torch.optim (the optimizer's exactness rule), and AdamW trains on from
    there; a plain model gets the same values, and so does the model of a closed optimizer; a model a
    live ShardedOptimizer holds, one of other names, and a folder that is not a checkpoint each raise,
    saying what to do."""
    pytest.importorskip("torch.distributed.checkpoint")
    xs = [torch.randn(4, 32, generator=torch.Generator().manual_seed(s)) for s in range(3)]

    def steps(model, opt):
        for x in xs:
            model(x).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    m = mxt.convert(net(), "row", format=fmt)
    opt = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2))
    steps(m, opt)
    mxt.save_checkpoint(tmp_path / "ck", m, opt)
    opt.close()
    ref = mxt.convert(net(), "row", format=fmt)
    steps(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    fresh = mxt.convert(net(seed=5), "row", format=fmt)
    mxt.load_checkpoint_weights(tmp_path / "ck", fresh)
    for (n, a), (_, b) in zip(fresh.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n
    x = torch.randn(2, 32)
    assert torch.equal(fresh(x), ref(x))
    plain = net(seed=6)
    mxt.load_checkpoint_weights(tmp_path / "ck", plain)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), ref.state_dict().values()))
    before = fresh[0].weight.detach()._data.clone()
    o = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh(x).pow(2).sum().backward()
    o.step()
    assert not torch.equal(fresh[0].weight.detach()._data, before)
    held = mxt.convert(net(seed=7), "row", format=fmt)
    hopt = mxt.ShardedOptimizer(held, lambda g: torch.optim.AdamW(g, lr=1e-2))
    with pytest.raises(mxt.CheckpointError, match=r"^load_checkpoint_weights: load into a model that convert\(\) "
                                                  r"made \(or a plain one\), not one a ShardedOptimizer holds"):
        mxt.load_checkpoint_weights(tmp_path / "ck", held)
    hopt.close()
    # the closed optimizer's model is nobody's now: its converted weights take the checkpoint's values
    # as their masters (and train on under torch.optim)
    mxt.load_checkpoint_weights(tmp_path / "ck", m)
    for (n, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n
    assert torch.equal(m(x), ref(x))
    with pytest.raises(mxt.CheckpointMismatchError, match=r"^load_checkpoint_weights: build the model the "
                                                          r"checkpoint was saved from"):
        mxt.load_checkpoint_weights(tmp_path / "ck", nn.Sequential(nn.Linear(32, 48)))
    with pytest.raises(mxt.CheckpointError, match=r"^load_checkpoint_weights: give the folder of a "
                                                  r"mxt.save_checkpoint checkpoint"):
        mxt.load_checkpoint_weights(tmp_path, net())


# ---- writes the bytes must follow, and the weight a backward uses -----------------------------



@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_writes_into_the_state_dicts_tensors_reach_the_forward(fmt, tmp_path):
    """model.state_dict()[k].copy_(v) and an in-place dcp.load into model.state_dict() (DCP's way of
    loading) after a forward: the masters took the values but the layers kept multiplying by the
    old bytes (the state dict's tensor had a version counter of its own). The next forward now uses
    the loaded values' quantization."""
    import torch.distributed.checkpoint as dcp
    src, m = mxt.convert(net(0), "row", format=fmt), mxt.convert(net(1), "row", format=fmt)
    x = torch.randn(4, 32)
    m(x)
    m.state_dict()["0.weight"].copy_(src[0].weight.detach())
    m.state_dict()["0.bias"].copy_(src[0].bias.detach())
    assert fresh(m[0]) and torch.equal(m[0](x), src[0](x))
    dcp.save({"model": src.state_dict()}, checkpoint_id=str(tmp_path))
    m2 = mxt.convert(net(2), "row", format=fmt)
    m2(x)
    dcp.load({"model": m2.state_dict()}, checkpoint_id=str(tmp_path))
    assert fresh(m2[0]) and fresh(m2[2]) and torch.equal(m2(x), src(x))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_numpy_of_a_weight_is_read_only_and_masters_changed_redoes_unseen_writes(fmt):
    """w.detach().numpy() shares the master's memory, but writes through numpy move no version
    counter, so the bytes never followed them: the array is read-only (numpy raises). A write
    mxshard cannot see (a tensor made over the master's storage) is redone by masters_changed(model),
    also in one process (it did nothing there), at every such write: NVFP4's tensor amax too (from
    the second one on, it kept the amax of the first: one refresh per master version)."""
    m = mxt.convert(net(), "row", format=fmt)
    m(torch.randn(2, 32))
    a = m[0].weight.detach().numpy()
    assert a.shape == (48, 32) and (a == m[0].weight.detach()._data.numpy()).all()
    with pytest.raises(ValueError, match="read-only"):
        a[:] = 0.25
    w = m[0].weight
    assert w.tolist() == w.data.tolist() == w.detach().clone().tolist() == w.detach()._data.tolist()
    alias = torch.empty(0).set_(m[0].weight.detach()._data.untyped_storage(), 0, (48, 32))
    for scale in (0.5, 0.7, 3.0):
        alias.mul_(scale)   # (another version counter: unseen)
        assert not fresh(m[0])
        mxt.masters_changed(m)
        assert fresh(m[0]), scale


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_master_set_to_a_view_of_a_buffer_follows_writes_into_the_buffer(fmt):
    """weight.data = a view into a larger buffer (ZeroRedundancyOptimizer's bucket views,
    vector_to_parameters): the master stays that view, as a plain Parameter would (it was cloned,
    so the later writes into the buffer never reached it), and its bytes follow the buffer, at
    every write (NVFP4's tensor amax too)."""
    m = mxt.convert(net(), "row", format=fmt)
    buf = torch.zeros(48 * 32 + 100)
    buf[100:].copy_(m[0].weight.detach()._data.flatten())
    m[0].weight.data = buf[100:].view(48, 32)
    m(torch.randn(2, 32))
    for scale in (-2.0, 0.7, 5.0):
        buf.mul_(scale)   # as a broadcast into the bucket: no version counter of the master moves
        assert torch.equal(m[0].weight.detach()._data, buf[100:].view(48, 32))
        assert fresh(m[0]), scale
    twin = copy.deepcopy(m)   # (the wrapper claims offset 0: deepcopy / torch.save work)
    assert torch.equal(twin[0].weight.detach()._data, buf[100:].view(48, 32))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_copies_set_to_another_buffer_leave_the_masters_buffer_view_alone(fmt):
    """The model's masters are views of one flat vector (vector_to_parameters), and an EMA kept as
    copies (p.detach().clone()) is set to views of a vector of its own the same way: the copies
    share the weight's WeightMeta, whose one slot for "the storage a master aliases" the copies
    took over, so the model's later writes into its vector went unseen (stale bytes). Per storage
    now: the model's bytes follow its vector, the copies' settings do not touch them."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters
    m = mxt.convert(net(), "row", format=fmt)
    flat = parameters_to_vector(m.parameters()).clone()
    vector_to_parameters(flat, m.parameters())
    ema = [p.detach().clone() for p in m.parameters()]
    vector_to_parameters(parameters_to_vector(ema).clone(), ema)
    x = torch.randn(3, 32)
    m(x)
    for scale in (0.5, -3.0):
        flat.mul_(scale)
        assert fresh(m[0]) and fresh(m[2]), scale


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_the_backward_multiplies_by_the_weight_the_forward_used(fmt):
    """torch.func.functional_call with a QuantMaster fast weight (first-order MAML): the backward
    read the module's own weight again (the call had put it back), so the input gradient was
    another weight's. It is now the fast weight's, as for a model holding it. An in-place write
    into the weight between forward and backward raises, as with nn.Linear; model.to() /
    share_memory() with a forward's graph still alive work."""
    from torch.func import functional_call
    m = mxt.convert(net(0), "both", format=fmt)
    holder = mxt.convert(net(1), "both", format=fmt)
    fast = holder[2].weight.detach().clone().requires_grad_()
    x = torch.randn(5, 32, requires_grad=True)
    functional_call(m, {"2.weight": fast}, (x,)).pow(2).sum().backward()
    gx, gfast = x.grad.clone(), fast.grad.clone()
    x.grad = None
    with torch.no_grad():
        m[2].weight.copy_(fast)
    m(x).pow(2).sum().backward()
    assert torch.equal(x.grad, gx) and torch.equal(m[2].weight.grad, gfast)
    y = m(x).sum()
    with torch.no_grad():
        m[2].weight.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    with pytest.raises(RuntimeError, match=r"^mxshard: pass torch.func.functional_call a QuantMaster for 2.weight"):
        functional_call(m, {"2.weight": torch.randn(8, 48)}, (x,))
    keep = m(x).sum()   # a graph alive
    assert m.share_memory() is m and m.to(torch.float32) is m
    del keep


@pytest.mark.parametrize("how", ["prune", "weight_norm", "spectral_norm", "parametrize"])
def test_convert_refuses_a_linear_whose_weight_is_computed(how):
    """prune / weight_norm / spectral_norm applied before convert() leave an nn.Linear whose weight is
    a value a hook computes: convert took that value as the master and dropped the mask and the norm
    silently (a 50 % pruned layer had no zero left after 3 steps). A parametrized linear matched by
    the policy stayed dense without a word. Both raise, saying what to do; skip= keeps them dense."""
    from torch.nn.utils import parametrizations, prune
    m = net()
    if how == "prune":
        prune.l1_unstructured(m[0], "weight", amount=0.5)
    elif how == "weight_norm":
        torch.nn.utils.weight_norm(m[0])
    elif how == "spectral_norm":
        torch.nn.utils.spectral_norm(m[0])
    else:
        parametrizations.orthogonal(m[0])
    first = (r"^convert: remove the parametrization of 0.weight first" if how == "parametrize"
             else r"^convert: remove what replaced 0.weight by a computed tensor first")
    with pytest.raises(ValueError, match=first):
        mxt.convert(m, "row")
    assert type(m[2]) is nn.Linear   # (nothing converted)
    out = mxt.convert(m, "row", skip=["0"])
    assert mxt.is_param_linear(out[2]) and not mxt.is_param_linear(out[0])


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_model_built_in_inference_mode_converts_and_runs(fmt):
    """A model built (or loaded) inside torch.inference_mode() and converted there (an inference
    server's habit): its first forward raised "Inference tensors do not track version counter".
    The master is a normal copy; the outputs are those of the same model built outside it."""
    x = torch.randn(3, 32)
    with torch.inference_mode():
        m = mxt.convert(net(4), "row", format=fmt)
        got = m(x)
    ref = mxt.convert(net(4), "row", format=fmt)
    with torch.no_grad():
        assert torch.equal(got, ref(x))


def test_hooks_buffers_and_attributes_of_a_converted_linear_stay():
    """Hooks registered on an nn.Linear before convert() (forward pre / forward / full backward),
    a buffer and an attribute on it were dropped with the replaced module, silently (a backward
    hook zeroing a gradient no longer did). They move to the converted linear; their handles
    still remove them."""
    m = net()
    seen = []
    h1 = m[0].register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    m[2].register_full_backward_pre_hook(lambda mod, go: (torch.zeros_like(go[0]),))
    m[0].register_buffer("mask", torch.ones(48))
    m[0].no_weight_decay = True
    mxt.convert(m, "row")
    m(torch.randn(4, 32)).sum().backward()
    assert seen == [torch.Size([4, 48])]
    assert m[2].weight.grad.abs().sum() == 0 and m[0].weight.grad.abs().sum() == 0   # (zeroed upstream too)
    assert torch.equal(m[0].mask, torch.ones(48)) and "0.mask" in m.state_dict() and m[0].no_weight_decay
    h1.remove()
    m(torch.randn(4, 32))
    assert len(seen) == 1


def test_forward_mode_ad_and_batched_experts_say_what_to_do():
    """Forward-mode AD (dual tensors) through a converted linear raised torch's "implement the jvp
    function" error; a policy naming experts stored as one [E, out, in] Parameter said "fix the
    pattern", though the pattern was right. Both now say what to do first."""
    import torch.autograd.forward_ad as fwAD
    m = mxt.convert(net(), "row")
    x = torch.randn(2, 32)
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match=r"^mxshard: leave 0 out of convert\(\) \(skip=\[...\]\) to run "
                                               r"forward-mode AD"):
            m(fwAD.make_dual(x, torch.randn_like(x)))

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(torch.randn(4, 64, 32))

    model = nn.Module()
    model.router, model.experts = nn.Linear(32, 4), Experts()
    for pattern in ("experts", "experts.*"):
        with pytest.raises(ValueError, match=r"^convert: keep batched weights dense .* \(experts.w1 \[4, 64, 32\]"):
            mxt.convert(model, {pattern: "row"})


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_state_dict_aliases_keep_vars_and_assign_loads(fmt):
    """A state dict taken before convert() (its tensors alias the storage the master took over), and
    a meta model loaded with assign=True from tensors someone keeps writing: writes through them
    changed the master but not the forward's bytes (the master's inner tensor had a version counter
    of its own). state_dict(keep_vars=True) gave a detached tensor, not the Parameter (a
    requires_grad filter dropped every converted weight). assign=True into a materialised
    converted linear replaced its bias (an optimizer built before trained the weight only)."""
    m = net(0)
    sd = m.state_dict()
    mxt.convert(m, "row", format=fmt)
    m(torch.randn(2, 32))
    sd["0.weight"].copy_(torch.randn(48, 32))
    assert torch.equal(m[0].weight.detach()._data, sd["0.weight"]) and fresh(m[0])
    src = {k: v.detach().clone() for k, v in net(1).state_dict().items()}
    with torch.device("meta"):
        b = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 8))
    mxt.convert(b, "row", format=fmt)
    b.load_state_dict(src, assign=True)
    b(torch.randn(2, 32))
    src["0.weight"].mul_(-1)
    assert torch.equal(b[0].weight.detach()._data, src["0.weight"]) and fresh(b[0])
    kv = m.state_dict(keep_vars=True)
    assert kv["0.weight"] is m[0].weight and kv["0.weight"].requires_grad
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.load_state_dict({k: v.detach().clone() for k, v in net(2).state_dict().items()}, assign=True)
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}
    m(torch.randn(3, 32)).sum().backward()
    opt.step()
    assert all(not torch.equal(v, before[k]) for k, v in m.state_dict().items()), "assign=True froze a parameter"
