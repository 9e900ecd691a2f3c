"""The run's position (:class:`Progress`) and ``last.pt``: what is saved after every epoch and
mid-epoch, and how a resumed run is put back exactly where the saved one was."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .build import Optimization
from .config import TrainConfig
from .dcp import SHARDED_DIR, clear, read_sharded, sharded_folder
from .distributed import Dist
from .report import truncate_metrics
from .state import atomic_torch_save, get_rng_state, set_rng_state

__all__ = [
    "RUN_MARKERS",
    "Progress",
    "claim_run_folder",
    "gather_cuda_rng",
    "gather_torch_rng",
    "restore_checkpoint",
    "save_checkpoint",
    "start_position",
]

RUN_MARKERS = ("summary.json", "last.pt", "metrics.jsonl", "model")
"""What a run leaves in its folder: a folder holding any of them holds a run."""
RUN_OUTPUTS = (*RUN_MARKERS, "sharded", "curves.png", "confusion.png", "bad_files.txt")
"""Everything a run writes in its folder (``.lock`` aside): what ``--overwrite`` removes."""


@dataclass(kw_only=True)
class Progress:
    """Where the run is. The first group is saved in ``last.pt`` and restored on resume; the
    second describes the epoch in progress; the last counts what this process did."""

    epoch: int = 0
    """Epochs completed."""
    step: int = 0
    """Optimizer steps completed (all epochs)."""
    best: float = -1.0
    """Best evaluation top-1 so far (-1: none yet)."""
    wall_before: float = 0.0
    """Wall seconds of the processes that ran this run before this one."""
    images: int = 0
    """Training images seen, all processes together."""
    train_s: float = 0.0
    """Seconds spent in training epochs (not evaluation): ``images / train_s`` is the throughput."""

    micro: int = 0
    """Micro-batches done in the epoch in progress."""
    loss_sum: float = 0.0
    """Their training-loss sum."""
    epoch_start_micro: int = 0
    epoch_start_images: int = 0

    steps_this_run: int = 0
    nan_skipped: int = 0
    """Optimizer steps skipped for a NaN/Inf loss in this process (``--on-nan skip``)."""
    saved_step: int | None = None
    """The step ``last.pt`` holds (None: nothing saved yet)."""
    interrupted: bool = False

    def start_epoch(self) -> None:
        """Remember where the epoch in progress (re)starts: at its beginning, or part-way after a resume."""
        self.epoch_start_micro, self.epoch_start_images = self.micro, self.images

    def finish_epoch(self) -> None:
        self.epoch += 1
        self.micro, self.loss_sum = 0, 0.0

    def kept(self, path: Path) -> str:
        """What a run stopped by an error leaves to resume from, for the error's message."""
        if self.saved_step is None:
            return "no checkpoint was saved yet"
        return f"{path} (step {self.saved_step}) holds the last good state"


def gather_torch_rng(dist: Dist, device: torch.device) -> list[torch.Tensor]:
    """Every rank's torch CPU generator state (a collective: all ranks call it), rank 0's first."""
    return _gather(torch.get_rng_state(), dist, device)


def gather_cuda_rng(dist: Dist, device: torch.device) -> list[torch.Tensor] | None:
    """Every rank's generator state of its own GPU (stochastic depth and token dropping draw there), rank 0's
    first; None off CUDA. A collective on CUDA: all ranks call it."""
    if device.type != "cuda":
        return None
    return _gather(torch.cuda.get_rng_state(device), dist, device)


def _gather(s: torch.Tensor, dist: Dist, device: torch.device) -> list[torch.Tensor]:
    if not dist.enabled:
        return [s]
    import torch.distributed as tdist

    got = [torch.empty_like(s) for _ in range(dist.world_size)]
    tdist.all_gather(got, s) if device.type == "cpu" else tdist.all_gather_object(got, s)
    return got


def save_checkpoint(
    path: Path,
    *,
    net: nn.Module,
    opt: Optimization,
    generator: torch.Generator,
    progress: Progress,
    plan: dict[str, Any],
    cfg: TrainConfig,
    wall_s: float,
    micro_done: int,
    torch_ranks: list[torch.Tensor],
    data_fingerprint: dict[str, Any] | None = None,
    sharded: str | None = None,
    cuda_ranks: list[torch.Tensor] | None = None,
) -> None:
    """Write ``last.pt`` atomically (rank 0 alone). ``micro_done`` is 0 at the end of an epoch,
    else the micro-batches done in the epoch in progress (a mid-epoch save). ``data_fingerprint``
    (:func:`~vitlab.train.loaders.data_fingerprint`, from the run's start) lets ``--resume`` detect changed data.
    ``sharded``: the folder (relative to ``path``'s) that holds the weights and optimizer state of an
    ``--fsdp`` run (:func:`~vitlab.train.dcp.write_sharded`), named instead of stored."""
    weights: dict[str, Any] = (
        {"model": net.state_dict(), "optimizer": opt.optimizer.state_dict()}
        if sharded is None
        else {"sharded": sharded}
    )
    blob = {
        **weights,
        "scheduler": opt.scheduler.state_dict(),
        "scaler": opt.scaler.state_dict() if opt.scaler is not None else None,
        "ema": opt.ema.state_dict() if opt.ema is not None else None,
        "rng": get_rng_state(),
        "torch_rng_ranks": torch_ranks,
        **({"cuda_rng_ranks": cuda_ranks} if cuda_ranks is not None else {}),
        "loader_rng": generator.get_state(),
        "epoch": progress.epoch,
        "step": progress.step,
        "micro_in_epoch": micro_done,
        # the samples all processes consumed in the epoch: a shard reader resumes there on any number of processes
        "samples_in_epoch": micro_done * (cfg.recipe.batch_size // cfg.recipe.accum_steps),
        "epoch_loss_sum": progress.loss_sum if micro_done else 0.0,
        "best_top1": progress.best,
        "plan": plan,
        "wall_s": wall_s,
        "train_images": progress.images,
        "train_s": progress.train_s,
        "config": json.dumps(cfg.to_dict()),
        "data_fingerprint": json.dumps(data_fingerprint),
        "vitlab_checkpoint": 1,
    }
    atomic_torch_save(blob, path)
    progress.saved_step = progress.step


def restore_checkpoint(
    state: dict[str, Any],
    *,
    net: nn.Module,
    opt: Optimization,
    generator: torch.Generator,
    rank: int,
    folder: Path | None = None,
) -> Progress:
    """Load ``state`` (a read ``last.pt``, from the run folder ``folder``) into the run's objects and
    generators; the saved position. The weights and optimizer state of a sharded run are read from the
    folder ``last.pt`` names (a collective: :func:`~vitlab.train.dcp.read_sharded`)."""
    if state.get("sharded"):
        read_sharded(sharded_folder(Path(folder or "."), state["sharded"]), net=net, optimizer=opt.optimizer)
    else:
        net.load_state_dict(state["model"])
        opt.optimizer.load_state_dict(state["optimizer"])
    opt.scheduler.load_state_dict(state["scheduler"])
    if opt.scaler is not None and state.get("scaler"):
        opt.scaler.load_state_dict(state["scaler"])
    if opt.ema is not None and state.get("ema"):
        opt.ema.load_state_dict(state["ema"])
    set_rng_state(state["rng"])
    torch_states = state.get("torch_rng_ranks")
    if torch_states is not None and rank < len(torch_states):
        torch.set_rng_state(torch_states[rank])
    cuda_states = state.get("cuda_rng_ranks")  # this rank's GPU generator (the one set_rng_state gave is rank 0's)
    if cuda_states is not None and rank < len(cuda_states) and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda_states[rank])
    generator.set_state(state["loader_rng"])
    return Progress(
        epoch=state["epoch"],
        step=state["step"],
        micro=_micro_in_epoch(state),
        loss_sum=state.get("epoch_loss_sum", 0.0),
        best=state["best_top1"],
        wall_before=state["wall_s"],
        images=state["train_images"],
        train_s=state["train_s"],
        saved_step=state["step"],
    )


def _micro_in_epoch(state: dict[str, Any]) -> int:
    """Micro-batches per process done in the saved epoch, from the global sample count where the checkpoint has
    one (the same number on any number of processes: a micro-batch is ``batch_size / accum_steps`` samples)."""
    if "samples_in_epoch" not in state:
        return int(state["micro_in_epoch"])
    cfg = json.loads(state["config"])["recipe"]
    return int(state["samples_in_epoch"]) // (int(cfg["batch_size"]) // int(cfg["accum_steps"]))


def claim_run_folder(out: Path, *, overwrite: bool, init: str | None, log: Callable[[str], None]) -> None:
    """Make ``out`` ready for a new run (not a resumed one); the caller holds its lock.

    A folder that holds another run (:data:`RUN_MARKERS`: finished, stopped or foreign) is refused
    in one line, unless ``overwrite``: then the previous run's outputs are removed before the new
    run writes anything, so that the folder holds only the new run. Other files are left alone. An
    empty or new folder is fine."""
    found = [n for n in RUN_MARKERS if (out / n).exists() or (out / n).is_symlink()]
    if not found:
        return
    if not overwrite:
        raise ConfigError(
            f"{out}: holds another run ({', '.join(found)}); pass --resume to continue it, "
            "--overwrite to replace it, or choose another --out"
        )
    if init is not None and Path(init).exists() and out.resolve() in Path(init).resolve().parents:
        raise ConfigError(f"--init {init}: is inside {out}, which --overwrite would clear; copy it elsewhere first")
    removed, kept = [], []
    for name in RUN_OUTPUTS:
        p = out / name
        if name == SHARDED_DIR:  # only the checkpoints vitlab wrote there; a link the user made stays
            if p.exists() or p.is_symlink():
                kept = clear(out)
                removed.append(name if not (p.exists() or p.is_symlink()) else f"checkpoints in {name}/")
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()  # (a link is removed, never what it points to)
        else:
            continue
        removed.append(name)
    log(f"{out}: --overwrite: removed the previous run's {', '.join(removed)}")
    if kept:
        log(f"{out / SHARDED_DIR}: kept {len(kept)} entries vitlab did not write ({', '.join(kept[:5])})")


def start_position(
    state: dict[str, Any] | None,
    *,
    net: nn.Module,
    opt: Optimization,
    generator: torch.Generator,
    dist: Dist,
    out: Path,
    plan: dict[str, Any],
    log: Callable[[str], None],
) -> Progress:
    """Where the run starts: at the beginning (``state`` is None: ``out/metrics.jsonl`` is cleared), or
    where the checkpoint ``state`` left it (:func:`restore_checkpoint`), keeping the ``metrics.jsonl``
    rows of the epochs it had finished."""
    if state is None:
        if dist.is_main:
            (out / "metrics.jsonl").unlink(missing_ok=True)
        return Progress()
    p = restore_checkpoint(state, net=net, opt=opt, generator=generator, rank=dist.rank, folder=out)
    # the saved schedule's length (or the one --epochs re-planned) and its warmup
    opt.set_total_steps(plan["total_steps"], warmup_steps=plan.get("warmup_steps"))
    if dist.is_main:
        truncate_metrics(out / "metrics.jsonl", last_epoch=p.epoch)
    if p.step >= plan["total_steps"] or p.epoch >= plan["epochs"]:
        log(f"{out}: the run is already complete ({p.step} steps); nothing to resume")
    else:
        log(f"resuming {out} at epoch {p.epoch + 1}, step {p.step}/{plan['total_steps']}")
    return p
