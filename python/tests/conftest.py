# SPDX-License-Identifier: MIT
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The tests mirror the package's folders (tests/torch/fsdp/ tests mxshard/torch/fsdp/, ...); their
# shared modules (torch_harness, reference, the *_cases modules the spawned ranks run) are imported
# by their file name from any folder: every test folder goes on sys.path (the test file names are
# unique: pytest's default import mode needs that), and the spawned ranks inherit it
# (torch_harness.child_pythonpath, multiprocessing's own sys.path hand-over).
TEST_DIRS = [HERE] + sorted(d for d, _, _ in os.walk(HERE) if d != HERE and "__pycache__" not in d)
for _d in reversed(TEST_DIRS):
    if _d not in sys.path:
        sys.path.insert(0, _d)
sys.path.insert(0, os.path.dirname(HERE))  # the package from the source tree when not installed


def _no_folder_as_torch():
    """tests/torch/ (the tests of mxshard.torch, no __init__.py) sits on sys.path: where torch is not
    installed, `import torch` would import that folder as an empty namespace package instead of
    failing. Make the import fail as it does without the folder, so every torch test skips."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return
    if spec is not None and spec.origin is None and all(
            os.path.abspath(p).startswith(HERE + os.sep) for p in (spec.submodule_search_locations or ())):
        sys.modules["torch"] = None  # import torch: ModuleNotFoundError


_no_folder_as_torch()

REPO = os.path.dirname(os.path.dirname(HERE))
VECTORS = os.path.join(REPO, "tests", "vectors")

# Triton's interpreter (the GEMM kernels' tests on CPU tensors) must be chosen before anything
# imports triton - torch.compile, FSDP2 and torch.distributed may, in tests collected earlier than
# test_torch_gemm.py: set it for the whole session where no GPU is visible.
if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch as _torch
        if not _torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except Exception:  # noqa: BLE001 - no torch (or --quick's stand-in): nothing uses Triton
        pass


def pytest_configure(config):
    # default library location: the build directory the scripts use
    if not any(os.environ.get(v) for v in ("MXSHARD_LIBDIR", "MXSHARD_HOST_LIB")):
        bd = os.environ.get("MXS_BUILDDIR", os.path.join(REPO, "build"))
        cand = os.path.join(bd if os.path.isabs(bd) else os.path.join(REPO, bd), "src", "host")
        if os.path.isdir(cand):
            os.environ["MXSHARD_LIBDIR"] = cand + os.pathsep + os.path.join(os.path.dirname(cand), "..", "cuda")


@pytest.fixture
def rng(request):
    seed = abs(hash(request.node.nodeid)) % (2 ** 32)
    return np.random.default_rng(seed)


def torch_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    return torch


def host_lib_or_skip(module_level=False):
    """libmxshard_host, else skip (with the reason); module_level=True: the whole test file."""
    import mxshard
    try:
        mxshard.library_info()
    except mxshard.LibraryNotFoundError as e:
        pytest.skip(f"libmxshard_host not found: {str(e).splitlines()[0]}", allow_module_level=module_level)


def torch_lib_or_skip():
    """torch and libmxshard_host, else skip (with the reason)."""
    torch = torch_or_skip()
    host_lib_or_skip()
    return torch


def gloo_or_skip(host_lib=False):
    """torch with torch.distributed over gloo, else skip; host_lib=True: also libmxshard_host."""
    torch = torch_or_skip()
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if host_lib:
        host_lib_or_skip()
    return torch


def cuda_or_skip():
    torch = torch_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import mxshard
    try:
        mxshard.library_info(cuda=True)
    except mxshard.LibraryNotFoundError as e:
        pytest.skip(f"libmxshard_cuda not found: {str(e).splitlines()[0]}")
    return torch


def _untouched_state(m):
    """What a ShardedOptimizer construction attaches to module m: its parameter objects (by every
    name, tied ones included), their and its buffers' storage, the gradient hooks on its
    parameters, its modules' forward (pre-)hooks and the optimizer that owns each module."""
    params = list(m.named_parameters(remove_duplicate=False))
    return {"parameter objects": {n: id(p) for n, p in params},
            "parameter storage": {n: p.data_ptr() if type(p).__name__ != "GatheredWeight" else None for n, p in params},
            "buffer storage": {n: t.data_ptr() for n, t in m.named_buffers()},
            "gradient hooks": {n: (list(getattr(p, "_post_accumulate_grad_hooks", None) or {}),
                                   list(getattr(p, "_backward_hooks", None) or {})) for n, p in params},
            "forward pre-hooks": {n: list(mod._forward_pre_hooks) for n, mod in m.named_modules()},
            "forward hooks": {n: list(mod._forward_hooks) for n, mod in m.named_modules()},
            "owners": {n: (lambda r: r() if r is not None else None)(getattr(mod, "_mxs_owner", None))
                       for n, mod in m.named_modules()},
            "weights": {n: mod._parameters.get("weight") for n, mod in m.named_modules()
                        if type(mod._parameters.get("weight")).__name__ == "QuantMaster"}}


def raises_untouched(m, f, exc, match):
    """f() raises exc (message matching `match`) and leaves module m as it was: the same parameter
    objects (each converted weight still its QuantMaster Parameter) and storage, the same buffer
    storage, no gradient hook, forward (pre-)hook or ShardedOptimizer owner added or removed (a
    refused construction attaches nothing)."""
    before = _untouched_state(m)
    with pytest.raises(exc, match=match):
        f()
    now = _untouched_state(m)
    for k, a in before.items():
        b = now[k]
        if k == "owners":
            assert all(b[n] is a[n] for n in a), f"a refused construction changed which optimizer owns a module: {b}"
        elif k == "weights":
            assert all(type(o._parameters.get("weight")).__name__ == "QuantMaster" and o._parameters["weight"] is w
                       for o, w in ((dict(m.named_modules())[n], w) for n, w in a.items())), \
                "a refused construction left a converted weight replaced"
        else:
            assert a == b, f"a refused construction changed the model's {k}"
