# SPDX-License-Identifier: MIT
"""How mxshard's checkpoints go through torch.distributed.checkpoint (DCP):
every saved quantity is ONE global 1-D tensor, of which each rank writes or
reads pieces (DCP chunks with global offsets), through two small planners
over DCP's default ones; the checksum of such pieces; reading a
directory's metadata. Used by mxshard.torch.checkpoint (the module doc
there says what is saved and why this representation)."""
from __future__ import annotations

import contextlib
import math
import os
import warnings

import torch

from .errors import CheckpointError

MODULUS = (1 << 31) - 1     # the checksum's modulus (a Mersenne prime)
_CHUNK = 1 << 22            # words per checksum chunk


# ---- small pure helpers ------------------------------------------------------------

def even(n, world, r):
    """Rank r's part [lo, hi) of n elements split evenly (the first ranks get the smaller parts)."""
    return n * r // world, n * (r + 1) // world


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def dtype_of(name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in the checkpoint")
    return dt


def checksum(t, offset):
    """Position-weighted sum mod MODULUS of the 16-bit words (bytes for 1-byte
    dtypes) of a 1-D piece that starts at element `offset` of its global
    tensor: sum over words w at global word index i of (w+1)*(i mod MODULUS + 1).
    Sums of disjoint pieces add up (mod MODULUS) to the whole tensor's."""
    t = t.detach().reshape(-1).contiguous()
    if t.numel() == 0:
        return 0
    es = t.element_size()
    if es == 1:
        words, per, mask = t.view(torch.uint8), 1, 0xFF
    elif es % 2 == 0:
        words, per, mask = t.view(torch.int16), es // 2, 0xFFFF
    else:
        raise CheckpointError(f"a tensor of dtype {t.dtype} can not be checksummed")
    base = int(offset) * per
    total = 0
    for i in range(0, words.numel(), _CHUNK):
        w = words[i:i + _CHUNK].to(torch.int64).bitwise_and_(mask).add_(1)
        idx = torch.arange(base + i, base + i + w.numel(), dtype=torch.int64, device=w.device)
        idx.remainder_(MODULUS).add_(1)
        total += int(w.mul_(idx).remainder_(MODULUS).sum())
    return total % MODULUS


# ---- DCP planners ------------------------------------------------------------------

def _dcp_api():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
    return dict(dcp=dcp, DefaultLoadPlanner=DefaultLoadPlanner, DefaultSavePlanner=DefaultSavePlanner,
                Chunk=ChunkStorageMetadata, Index=MetadataIndex, Props=TensorProperties,
                TensorMD=TensorStorageMetadata, LoadPlan=LoadPlan, SavePlan=SavePlan, TensorWriteData=TensorWriteData,
                WriteItem=WriteItem, WriteItemType=WriteItemType, read_items=create_read_items_for_chunk_list)


def _planners():
    D = _dcp_api()
    Size = torch.Size

    class _PieceSavePlanner(D["DefaultSavePlanner"]):
        """Writes exactly the given pieces: {key: (numel, [(offset, 1-D tensor), ...])}."""

        def __init__(self, pieces):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self._pieces = pieces
            self._by_index = {}

        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            self.state_dict, self.is_coordinator = {}, is_coordinator

        def create_local_plan(self):
            items = []
            for key, (numel, plist) in self._pieces.items():
                for off, t in plist:
                    items.append(D["WriteItem"](
                        index=D["Index"](key, Size([off])), type=D["WriteItemType"].SHARD,
                        tensor_data=D["TensorWriteData"](chunk=D["Chunk"](offsets=Size([off]), sizes=Size([t.numel()])),
                                                         properties=D["Props"].create_from_tensor(t),
                                                         size=Size([numel]))))
                    self._by_index[(key, off)] = t
            self.plan = D["SavePlan"](items)
            return self.plan

        def resolve_data(self, write_item):
            t = self._by_index[(write_item.index.fqn, int(write_item.index.offset[0]))]
            return t.detach().contiguous().cpu()

    class _PieceLoadPlanner(D["DefaultLoadPlanner"]):
        """Reads into the given pieces: {key: (numel, offset, 1-D tensor)} (one range per key),
        from whichever saved pieces overlap it; checks presence, size, dtype and coverage."""

        def __init__(self, dests):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self._dests = dests

        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            self.state_dict, self.metadata, self.is_coordinator = {}, metadata, is_coordinator

        def create_local_plan(self):
            reqs = []
            for key, (numel, off, t) in self._dests.items():
                md = self.metadata.state_dict_metadata.get(key)
                if md is None:
                    raise CheckpointError(f"the checkpoint has no key {key!r}")
                if not isinstance(md, D["TensorMD"]) or tuple(md.size) != (numel,) or md.properties.dtype != t.dtype:
                    raise CheckpointError(f"{key}: saved as {getattr(md, 'size', type(md).__name__)} "
                                          f"{getattr(getattr(md, 'properties', None), 'dtype', '')}, expected "
                                          f"a 1-D {t.dtype} tensor of {numel} elements")
                r = D["read_items"](key, md, [D["Chunk"](offsets=Size([off]), sizes=Size([t.numel()]))])
                got = sum(int(math.prod(x.lengths)) for x in r)
                if got != t.numel():
                    raise CheckpointError(f"{key}: the saved pieces cover {got} of the {t.numel()} elements "
                                          f"[{off}, {off + t.numel()}) this rank needs")
                reqs += r
            return D["LoadPlan"](reqs)

        def lookup_tensor(self, index):
            return self._dests[index.fqn][2]

        def load_bytes(self, read_item, value):
            raise CheckpointError(f"{read_item.dest_index.fqn}: a bytes record where a tensor was expected")

    return _PieceSavePlanner, _PieceLoadPlanner


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _dcp_kwargs(opt):
    return {"process_group": opt.comm.group} if opt.comm.active else {"no_dist": True}


def dcp_error(e):
    """A compact message for DCP's CheckpointException (ranks and their exceptions) or any error."""
    fails = getattr(e, "failures", None)
    if isinstance(fails, dict) and fails:
        parts = []
        for r, v in sorted(fails.items()):
            exc = v[0] if isinstance(v, tuple) else v
            parts.append(f"rank {r}: {type(exc).__name__}: {exc}")
        return "; ".join(parts)
    return f"{type(e).__name__}: {e}"


# ---- reading and writing ----------------------------------------------------------

def read_metadata(path, meta_key):
    """The DCP metadata of checkpoint directory `path`, which must hold a 1-D uint8 `meta_key`."""
    D = _dcp_api()
    p = os.fspath(path)
    if not os.path.isdir(p):
        raise CheckpointError(f"load_checkpoint: {p!r} is not a directory")
    if not os.path.isfile(os.path.join(p, ".metadata")):
        raise CheckpointError(f"load_checkpoint: {p!r} holds no DCP checkpoint (no .metadata file)")
    try:
        md = D["dcp"].FileSystemReader(p).read_metadata()
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"load_checkpoint: the DCP metadata of {p!r} is unreadable "
                              f"({type(e).__name__}: {e})") from e
    m = md.state_dict_metadata.get(meta_key)
    if m is None or not isinstance(m, D["TensorMD"]) or m.properties.dtype != torch.uint8 or len(m.size) != 1:
        raise CheckpointError(f"load_checkpoint: {p!r} is not an mxshard checkpoint (no {meta_key} record)")
    return md


def load_pieces(path, opt, dests):
    """Reads {key: (numel, offset, 1-D tensor)} of directory `path` (collective over opt's group)."""
    _, load_planner = _planners()
    D = _dcp_api()
    try:
        with _quiet():
            D["dcp"].load({}, storage_reader=D["dcp"].FileSystemReader(os.fspath(path)),
                          planner=load_planner(dests), **_dcp_kwargs(opt))
    except BaseException as e:  # noqa: BLE001 - CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        fails = getattr(e, "failures", None)
        if isinstance(fails, dict):
            for v in fails.values():
                exc = v[0] if isinstance(v, tuple) else v
                if isinstance(exc, CheckpointError):
                    raise CheckpointError(f"load_checkpoint: {exc}") from None
        raise CheckpointError(f"load_checkpoint: reading {os.fspath(path)!r} failed (a truncated or damaged "
                              f"file?): {dcp_error(e)}") from None



def save_pieces(path, opt, pieces):
    """Writes {key: (numel, [(offset, 1-D tensor), ...])} to directory `path` (collective over
    opt's group). DCP's errors propagate (the caller turns them into a verdict)."""
    save_planner, _ = _planners()
    D = _dcp_api()
    with _quiet():
        D["dcp"].save({}, storage_writer=D["dcp"].FileSystemWriter(os.fspath(path)), planner=save_planner(pieces),
                      **_dcp_kwargs(opt))
