"""DistributedDataParallel setup from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

``torchrun --nproc_per_node N -m vitlab train ...`` on one machine; on several, the same
command on each node with ``--nnodes M --node_rank i --rdzv_backend c10d --rdzv_endpoint HOST:PORT``.
gloo on CPU; on GPU NCCL for CUDA tensors and gloo for CPU ones. Rank 0 alone logs and writes files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .devices import resolve_device

__all__ = ["Dist", "all_reduce_sum", "any_rank", "barrier", "broadcast_ints", "setup", "teardown"]


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str, *, group: bool = False) -> tuple[Dist, torch.device]:
    """Join the process group when launched by torchrun; pick this process's device: ``device``
    resolved by :func:`vitlab.devices.resolve_device`, and a CUDA device without an index becomes
    this process's GPU (``LOCAL_RANK`` under torchrun, else the current one).

    ``group``: a process group even for one process (``--fsdp`` shards over a group, and a sharded
    run resumes on any number of processes, one included): without torchrun, a group of one held in
    this process's memory (no port, no rendezvous)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local if world > 1 else torch.cuda.current_device())
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        # On GPUs the small CPU tensors (stop flags, evaluation counts, RNG states) go through gloo:
        # a process group of NCCL alone refuses them ("No backend type associated with device type cpu").
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo")
    elif group and not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return Dist(rank, world, local), dev


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flags: list[bool], d: Dist) -> list[bool]:
    """Each of ``flags`` True on every rank when it is True on at least one: one decision for all ranks
    (a collective: all ranks call it)."""
    t = torch.tensor([int(f) for f in flags])
    if d.enabled:
        dist.all_reduce(t)
    return [bool(v) for v in t.tolist()]


def broadcast_ints(values: list[int], d: Dist, device: torch.device) -> list[int]:
    """Rank 0's integers on every rank (e.g. a plan made from rank 0's timing)."""
    if not d.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return [int(v) for v in t.tolist()]


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
