# SPDX-License-Identifier: MIT
"""WIP."""


def load_checkpoint_weights(path, model, **kw):
    raise NotImplementedError("WIP")
