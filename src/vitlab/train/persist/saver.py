"""The one owner of a run's checkpoint files (timm's ``CheckpointSaver``): ``last.pt`` (everything needed to resume
exactly, written atomically, with every process's random generators), the sharded folder of an ``--fsdp`` run and
its pruning (:mod:`.dcp`), and ``model/`` (the best or the last weights, as a vitlab folder); beside ``last.pt``,
``sizing.json`` with the plan as it stands at that save."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as tdist
from torch import nn

from ..._fs import own_folder
from ...adapters import has_adapters, merged_copy
from ...adapters.peft_files import save_adapters
from ...checkpoints import save
from ...distributed import Dist
from ...evaluate.calibration import Calibration
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig
from ..sizing.choice import Sizing
from ..sizing.steps import RunPlan
from .dcp import prune, read_sharded, sharded_folder, write_sharded
from .outputs import ADAPTERS_DIR, write_sizing
from .position import RunPosition
from .state import atomic_torch_save, get_rng_state, set_rng_state

__all__ = ["CheckpointSaver", "Weights"]


class Weights(Protocol):
    """What changes the weights, each with its state in ``last.pt``
    (:class:`~vitlab.train.engine.optim.Optimization`)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    ema: Any


class CheckpointSaver:
    """The checkpoint files of the run in ``out`` for this process (``dist``, ``device``); ``sharded``: an ``--fsdp``
    run, whose weights and optimizer state ``last.pt`` names in a sharded folder instead of holding them."""

    def __init__(
        self, out: Path, *, dist: Dist, device: torch.device, sharded: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        self.out, self.dist, self.device, self.sharded, self.log = out, dist, device, sharded, log

    @property
    def last(self) -> Path:
        return self.out / "last.pt"

    def save(
        self,
        *,
        net: nn.Module,
        opt: Weights,
        generator: torch.Generator,
        position: RunPosition,
        plan: RunPlan,
        cfg: TrainConfig,
        sizing: Sizing,
        wall_s: float,
        micro_done: int,
        data_fingerprint: dict[str, Any] | None = None,
        packed: tuple[int, int] = (0, 0),
    ) -> None:
        """Save ``last.pt``: ``micro_done`` micro-batches into the current epoch (0: at its start). A collective:
        every rank calls it (their RNG states are gathered; with ``--fsdp`` every rank first writes its shards of the
        weights and optimizer state into the folder ``last.pt`` then names), rank 0 writes the file and deletes the
        sharded folders it no longer names. ``data_fingerprint``
        (:func:`~vitlab.train.engine.run_data.data_fingerprint`) lets ``--resume`` detect changed data; ``packed``: the
        epoch's ``(tokens, slots)`` so far, all processes together (``--pack``: the padding of the epoch)."""
        d = self.dist
        sharded = None
        if self.sharded:
            sharded = write_sharded(self.out, net=net, optimizer=opt.optimizer, step=position.step, d=d,
                                    device=self.device)  # fmt: skip
        torch_ranks = _gather(torch.get_rng_state(), d, self.device)
        cuda_ranks = (
            _gather(torch.cuda.get_rng_state(self.device), d, self.device) if self.device.type == "cuda" else None
        )
        if not d.is_main:
            return
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
            "epoch": position.epoch,
            "step": position.step,
            "micro_in_epoch": micro_done,
            # the samples all processes consumed in the epoch: a shard reader resumes there on any number of processes
            "samples_in_epoch": micro_done * (sizing.recipe.batch_size // sizing.recipe.accum_steps),
            "epoch_loss_sum": position.loss_sum if micro_done else 0.0,
            "epoch_loss_count": position.loss_count if micro_done else 0,
            "epoch_nan_skipped": position.skipped if micro_done else 0,
            "epoch_tokens": list(packed) if micro_done else [0, 0],
            "best_top1": position.best,
            "plan": plan.to_dict(),
            "wall_s": wall_s,
            "train_images": position.images,
            "train_s": position.train_s,
            "config": json.dumps(cfg.to_dict()),  # what was asked
            "sizing": json.dumps(sizing.to_dict()),  # what was chosen
            "data_fingerprint": json.dumps(data_fingerprint),
            "vitlab_checkpoint": 1,
        }
        atomic_torch_save(blob, self.last)
        write_sizing(self.out, sizing.record(cfg, plan=plan, fingerprint=data_fingerprint))  # the plan as it is now
        position.saved_step = position.step
        if sharded is not None:
            prune(self.out, keep=sharded)

    def restore(
        self, state: dict[str, Any], *, net: nn.Module, opt: Weights, generator: torch.Generator
    ) -> RunPosition:
        """Load ``state`` (a read ``last.pt``) into the run's objects and generators; the saved position. The
        weights and optimizer state of a sharded run are read from the folder ``last.pt`` names (a collective:
        :func:`~vitlab.train.persist.dcp.read_sharded`)."""
        rank = self.dist.rank
        if state.get("sharded"):
            read_sharded(sharded_folder(self.out, state["sharded"]), net=net, optimizer=opt.optimizer)
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
        tokens, slots = state.get("epoch_tokens", (0, 0)) if rank == 0 else (0, 0)  # summed over ranks once
        return RunPosition(
            tokens=int(tokens),
            slots=int(slots),
            epoch=state["epoch"],
            step=state["step"],
            micro=(micro := _micro_in_epoch(state)),
            loss_sum=state.get("epoch_loss_sum", 0.0),
            loss_count=int(state.get("epoch_loss_count", micro)),  # before the count was saved: every micro-batch
            skipped=int(state.get("epoch_nan_skipped", 0)),
            best=state["best_top1"],
            wall_before=state["wall_s"],
            images=state["train_images"],
            train_s=state["train_s"],
            saved_step=state["step"],
        )

    def save_model(
        self, model: nn.Module, *, cfg: TrainConfig, recipe: Recipe, ev: dict[str, Any], epoch: int,
        data: dict[str, Any] | None = None, calibration: Calibration | None = None,
    ) -> None:  # fmt: skip
        """``model/``: ``model`` as a vitlab folder, a plain ViT (the adapters of ``--tune lora`` or ``ssf`` merged
        into a copy's weights: :func:`vitlab.adapters.merged_copy`; with ``--keep-adapters`` LoRA's adapters alone
        also go to ``adapters/`` in ``peft``'s files) with what produced it (the ``recipe`` trained with, data, epoch,
        accuracy, ``--init``) and its ``calibration`` (:func:`~vitlab.evaluate.calibration.calibrate` of these weights'
        evaluation: ``temperature``, which ``vitlab predict`` divides the logits by, and the ECE with and without it;
        none: no temperature, ``T = 1``).
        ``data``: what the run records of its data (:func:`vitlab.train.engine.run_data.data_record`: its absolute
        location, fingerprint, how a folder was stored), else ``cfg.data`` as given. It replaces the run's own earlier
        ``model/`` (the run folder was checked when the run started); a link named ``model`` is replaced by a folder
        of its own, never written into (:func:`~vitlab._fs.own_folder`)."""
        r = recipe
        folder = own_folder(self.out / "model", what="the model (model.safetensors, config.json)", log=self.log)
        save(
            merged_copy(model),  # a plain ViT: the adapters (--tune lora, ssf) merged into its weights
            folder,
            overwrite=True,
            extra={
                "crop_pct": r.crop_pct,
                "recipe": r.name,
                "data": cfg.data,
                **(data or {}),
                "epoch": epoch,
                "top1": ev["top1"],
                "top5": ev["top5"],
                "init": cfg.init,
                "objective": cfg.objective,
                # (null: none fitted here; never the temperature of an --init model, fitted to other weights)
                **(calibration.scalars() if calibration is not None else {"temperature": None}),
            },
        )
        if cfg.keep_adapters and has_adapters(model):
            where = own_folder(self.out / ADAPTERS_DIR, what="the LoRA adapters (adapter_model.safetensors, "
                               "adapter_config.json)", log=self.log)  # fmt: skip
            save_adapters(model, where, base=cfg.init)


def _gather(s: torch.Tensor, dist: Dist, device: torch.device) -> list[torch.Tensor]:
    """Every rank's ``s`` (a generator's state; a collective: all ranks call it), rank 0's first."""
    if not dist.enabled:
        return [s]
    got = [torch.empty_like(s) for _ in range(dist.world_size)]
    tdist.all_gather(got, s) if device.type == "cpu" else tdist.all_gather_object(got, s)
    return got


def _micro_in_epoch(state: dict[str, Any]) -> int:
    """Micro-batches per process done in the saved epoch, from the global sample count where the checkpoint has
    one (the same number on any number of processes: a micro-batch is ``batch_size / accum_steps`` samples)."""
    if "samples_in_epoch" not in state:
        return int(state["micro_in_epoch"])
    r = json.loads(state.get("sizing") or state["config"])["recipe"]  # the recipe trained with
    return int(state["samples_in_epoch"]) // (int(r["batch_size"]) // int(r["accum_steps"]))
