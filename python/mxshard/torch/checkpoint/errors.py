# SPDX-License-Identifier: MIT
"""The exceptions of mxshard.torch's checkpoints and exports (re-exported by
mxshard.torch and mxshard.torch.checkpoint)."""

__all__ = ["CheckpointError", "CheckpointMismatchError"]


class CheckpointError(ValueError):
    """A checkpoint or export that can not be loaded: missing, unreadable,
    damaged (a truncated or modified file, a missing key, a checksum
    mismatch), or a call the group did not make together."""

    __module__ = "mxshard.torch.checkpoint"


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint or export of another model or configuration, or one
    whose primaries differ from the ones rebuilt from its masters."""

    __module__ = "mxshard.torch.checkpoint"
