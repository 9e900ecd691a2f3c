"""Sharded checkpoints of ``--fsdp`` runs, through ``torch.distributed.checkpoint`` (DCP).

A sharded run's ``last.pt`` holds everything but the weights and the optimizer state (position,
schedule, RNG states, plan, configuration) and names the folder that holds those two:
``sharded/step-<step>-<token>/``, where each process wrote its own shards (``__<rank>_0.distcp``)
and rank 0 the ``.metadata`` that maps every tensor's pieces to files. DCP reads such a folder back
on any number of processes, each loading the slices its own shards need: save with 8, resume with 1.

A save is a collective and never leaves a half-written folder that could be taken for a complete
one: every rank writes into ``sharded/.<name>.tmp``; when all have finished (DCP's own final
collective, after which the metadata is written), rank 0 renames it to ``sharded/<name>``, then
writes ``last.pt`` naming it (:func:`~vitlab.train.state.atomic_torch_save`), and only then deletes
the folders ``last.pt`` no longer names (:func:`prune`). A kill at any moment leaves ``last.pt``
naming a complete folder: the previous one until the new ``last.pt`` is in place. Temporary folders
of killed saves are deleted by the next save (the run folder's lock keeps out other writers).

Unlike ``last.pt`` (read with ``weights_only=True``), DCP reads its ``.metadata`` with ``pickle``:
resume only from sharded checkpoints you wrote or trust.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import torch
from torch import nn

from .._fs import fsync_dir
from ..errors import CheckpointError
from .distributed import Dist, barrier, broadcast_ints

__all__ = ["SHARDED_DIR", "prune", "read_sharded", "write_sharded"]

SHARDED_DIR = "sharded"
"""The run folder's sub-folder of sharded checkpoints."""


def write_sharded(
    out: Path, *, net: nn.Module, optimizer: torch.optim.Optimizer, step: int, d: Dist, device: torch.device
) -> str:
    """Save the sharded ``net``'s weights and ``optimizer``'s state (a collective: every rank calls it)
    into a new folder under ``out/sharded``; its name relative to ``out``, for ``last.pt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = out / SHARDED_DIR
    if d.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for tmp in root.glob(".*.tmp"):  # a killed save's (only this run writes here: it holds the folder's lock)
            shutil.rmtree(tmp, ignore_errors=True)
    (token,) = broadcast_ints([secrets.randbits(31)], d, device)  # one name on every rank
    name = f"step-{step:08d}-{token:08x}"
    tmp = root / f".{name}.tmp"
    barrier(d)  # the folder exists and is clean before any rank writes
    model_state, optim_state = get_state_dict(net, optimizer)
    try:
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    except (OSError, dcp.CheckpointException) as e:  # DCP gathers every rank's failure into the latter
        kept = "the previous checkpoint is kept" if (out / "last.pt").is_file() else "no checkpoint was written"
        raise CheckpointError(f"{tmp}: cannot write the sharded checkpoint ({_cause(e)}); {kept}") from None
    barrier(d)
    if d.is_main:
        os.replace(tmp, root / name)
        fsync_dir(root)
    return f"{SHARDED_DIR}/{name}"


def prune(out: Path, *, keep: str) -> None:
    """Delete the sharded checkpoints of ``out`` other than ``keep`` (rank 0, after ``last.pt`` names ``keep``)."""
    root = out / SHARDED_DIR
    for p in root.iterdir() if root.is_dir() else ():
        if p.is_dir() and p.name != Path(keep).name and not p.name.endswith(".tmp"):
            shutil.rmtree(p, ignore_errors=True)


def read_sharded(folder: Path, *, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load the weights and optimizer state saved in ``folder`` into ``net`` and ``optimizer`` (a
    collective), resharded to this run's processes; ``net`` may be sharded or not."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (folder / ".metadata").is_file():
        raise CheckpointError(
            f"{folder}: the sharded checkpoint last.pt names is missing or incomplete (no .metadata); "
            "start a new run (--overwrite)"
        )
    model_state, optim_state = get_state_dict(net, optimizer)  # this run's layout: what each rank loads into
    state = {"model": model_state, "optim": optim_state}
    try:
        dcp.load(state, checkpoint_id=folder)
    except (Exception, dcp.CheckpointException) as e:  # a missing shard, a changed model, on any rank
        raise CheckpointError(f"{folder}: cannot read the sharded checkpoint ({_cause(e)})") from None
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _cause(e: BaseException) -> str:
    """One line for ``e``: the first rank's failure when DCP gathered them (``CheckpointException.failures``)."""
    failures = getattr(e, "failures", None)
    if failures:
        first = failures[min(failures)]
        e = first[0] if isinstance(first, tuple) else first
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
