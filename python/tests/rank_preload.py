# SPDX-License-Identifier: MIT
"""Imported by the one forkserver of a test session (torch_harness.start_context), never by a
test: torch and every module whose worker the spawned ranks run, imported once there (with their
warm-ups: torch_harness.WARM_UP_VAR), so that no rank forked from the server imports them again
(a fresh interpreter importing torch costs seconds on 2 cores, per rank). A module that fails to
import here (not installed: transformers for hf_cases; broken) is left out: the ranks that need it
import it themselves and report the error as their own, as they would without the preload."""
import importlib

MODULES = ("torch", "torch.distributed", "dist_cases", "test_nvfp4_gloo", "torch_dist_cases", "torch_optim_habit_cases",
           "torch_ckpt_cases", "torch_fsdp_cases", "torch_nvfp4_cases", "hf_cases")

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except BaseException:  # noqa: BLE001 - anything (pytest.skip raises a BaseException): the server must start
        pass
