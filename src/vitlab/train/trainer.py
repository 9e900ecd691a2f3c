"""``fit``: data -> model -> optimiser -> epochs -> reports, with exact resume and DDP.

Outputs under ``out``: ``metrics.jsonl``, ``summary.json``, ``curves.png``, ``confusion.png``,
``model/`` (vitlab folder: best or last weights, class names, preprocessing) and ``last.pt``
(everything needed to resume: model, optimizer, scheduler, scaler, EMA, RNG states,
epoch and step, the run's configuration).

The parts live beside this module: :mod:`.config` (options and their checks), :mod:`.loaders`
(data), :mod:`.build` (model, optimizer), :mod:`.budget` (``--time-budget``), :mod:`.checkpointing`
(``last.pt``), :mod:`.loop` (one epoch) and :mod:`.report` (outputs); :class:`Trainer` joins them.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from .._fs import FolderLock
from ..errors import ConfigError, NonFiniteLossError
from . import report
from .advice import advice_line
from .budget import _REPLAN_AT, _plan_budget, _steps_in_budget, warmup_for
from .build import build_model, micro_batch_estimate
from .checkpointing import claim_run_folder, gather_cuda_rng, gather_torch_rng, save_checkpoint
from .dcp import prune, write_sharded
from .distributed import any_rank, barrier, setup, teardown
from .loaders import eval_shard
from .loop import EpochResult, StopSignals, train_one_epoch
from .resolution import resize_batch, size_at
from .setup import TrainerSetup
from .spec.config import TrainConfig
from .spec.resume import resumed_config
from .spec.rules import check_init, validate
from .state import load_state
from .token_drop import ends_dropping, rate_at, set_rate

__all__ = ["TrainConfig", "Trainer", "build_model", "fit"]
# Also importable from here, where they used to live:
_MOVED = (_REPLAN_AT, _plan_budget, _steps_in_budget, eval_shard, micro_batch_estimate)


def fit(
    cfg: TrainConfig, *, resume: bool = False, given: Collection[str] | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Train (or resume) one run; returns the summary (also written to ``out/summary.json``).

    ``given``: the command-line flags the user gave; a resume compares them with the saved run
    (:func:`~vitlab.train.config.resumed_config`).

    ``summary["interrupted"]`` is True when the run stopped early (a stop signal: ``summary["signal"]``
    names it; ``stop_after``); ``last.pt`` then holds the exact position to continue from.

    The run folder is locked while the run writes it (:class:`~vitlab._fs.FolderLock`; rank 0 under
    torchrun). A new run into a folder that holds another run is refused unless ``overwrite``, which
    first removes the previous run's outputs (:func:`~vitlab.train.checkpointing.claim_run_folder`).
    A stop signal that arrives before training begins ends the run at once
    (:class:`~vitlab.train.loop.StoppedBeforeTraining`).
    """
    if resume and overwrite:
        raise ConfigError("--overwrite and --resume exclude each other: one continues the run, the other replaces it")
    out = Path(cfg.out)
    state: dict[str, Any] | None = None
    if resume:
        state = load_state(out / "last.pt")
        cfg = resumed_config(state, cfg, flags=given, log=print if os.environ.get("RANK", "0") == "0" else None)
    validate(cfg)
    if cfg.init:
        import vitlab

        check_init(cfg, vitlab.load(cfg.init).config)
    d, device = setup(cfg.device, group=cfg.fsdp)
    try:
        with StopSignals(single_process=not d.enabled) as stop, contextlib.ExitStack() as held:
            if d.is_main:
                held.enter_context(FolderLock(out))
                if state is None:
                    claim_run_folder(out, overwrite=overwrite, init=cfg.init, log=print)
            summary = Trainer(cfg=cfg, dist=d, device=device, out=out, state=state, stop=stop).run()
        barrier(d)  # no process tears its group down while another still writes its results or talks to it
        return summary
    finally:
        teardown()


class Trainer(TrainerSetup):
    """One process's part of one run. Construction (:class:`~vitlab.train.setup.TrainerSetup`) prepares
    everything (data, model, plan, optimizer, the resumed position); :meth:`run` trains to the end of
    the plan or until asked to stop, and returns the summary. Where the run is, is one object:
    :attr:`progress`, a :class:`~vitlab.train.checkpointing.Progress`."""

    def run(self) -> dict[str, Any]:
        """Train the planned epochs (or until stopped), then write the summary and figures."""
        from .._progress import ProgressLog

        p, plan = self.progress, self.plan
        self.bar = ProgressLog(
            total=plan["total_steps"], initial=p.step, desc="train", enabled=self.cfg.progress and self.dist.is_main
        )
        with contextlib.ExitStack() as scope:
            if self.stop is None:  # constructed on its own, not by fit()
                self.stop = scope.enter_context(StopSignals(single_process=not self.dist.enabled))
            self.stop.training()
            self._token_drop_phase()
            try:
                while p.epoch < plan["epochs"] and p.step < plan["total_steps"] and self._epoch():
                    pass
            except NonFiniteLossError as e:
                raise NonFiniteLossError(
                    f"{e}, global step {p.step + 1}: stopped before that update; {p.kept(self.out / 'last.pt')}. "
                    "Lower --lr, set --clip-grad, or pass --on-nan skip"
                ) from None
            finally:
                self.bar.close()
        return self._finish()

    def _epoch(self) -> bool:
        """Train (the rest of) one epoch and evaluate it; False when the run stops here."""
        p, cfg, lo, r = self.progress, self.cfg, self.loaders, self.cfg.recipe
        p.start_epoch()
        res = train_one_epoch(
            self.run_model,
            lo.train_loader(p.epoch, p.micro),
            optimizer=self.opt.optimizer,
            scheduler=self.opt.scheduler,
            device=self.device,
            objective=self.objective,
            mix=lo.mix,
            accum_steps=r.accum_steps,
            clip_grad=r.clip_grad,
            amp_dtype=self.amp_dtype,
            scaler=self.opt.scaler,
            ema=self.opt.ema,
            on_step=self._on_step,
            on_nan=cfg.on_nan,
            resize=self._resize if r.res_schedule else None,
            loss_sum=p.loss_sum,
        )
        p.nan_skipped += res.skipped
        p.train_s += res.seconds
        if res.stopped and p.micro < lo.micro_per_epoch and p.step < self.plan["total_steps"]:
            p.interrupted = True  # stopped mid-epoch: _on_step saved the exact position
            return False
        t_end = time.perf_counter()
        self._end_epoch(res)
        if res.steps and not res.stopped:
            per_step = res.seconds / res.steps
            new = self.replan.after_epoch(
                step=p.step,
                planned=self.plan["total_steps"],
                per_step=per_step,
                overhead_s=time.perf_counter() - t_end,
                dist=self.dist,
                device=self.device,
            )
            if new is not None:
                self._replanned(new, per_step, late=True)
                self._checkpoint(micro_done=0)  # last.pt was written with the plan before the cut
        if res.stopped and p.step < self.plan["total_steps"]:
            p.interrupted = True
            return False
        return True

    def _resize(self, x: torch.Tensor) -> torch.Tensor:
        """Progressive resolution: the batch at the size the schedule gives the coming optimizer step."""
        size = size_at(self.cfg.recipe.res_schedule, step=self.progress.step, total_steps=self.plan["total_steps"])
        return resize_batch(x, size)

    def _token_drop_phase(self) -> None:
        """Unmasked tuning (``--token-drop-until``): from the planned switch on, the model sees every token.
        Called after every step: a run that drops tokens throughout (or never) returns at once."""
        if not ends_dropping(self.cfg.recipe):
            return
        plan = self.plan
        rate = rate_at(self.cfg.recipe, step=self.progress.step, total_steps=plan["total_steps"])
        if set_rate(self.model, rate) and rate == 0.0 and self.dist.is_main:
            self.bar.line(
                f"token dropping ends after step {self.progress.step} of {plan['total_steps']}: "
                "every token from here (--token-drop-until)"
            )

    def _on_step(self, res: EpochResult, loss: float) -> bool:
        """After each optimizer step: count it, re-plan a time budget once, decide whether to stop,
        save mid-epoch when stopping or when ``--save-every`` is due. True: stop the epoch here."""
        p, cfg, d = self.progress, self.cfg, self.dist
        p.step += 1
        p.steps_this_run += 1
        p.images = p.epoch_start_images + res.images * d.world_size
        p.micro = p.epoch_start_micro + res.micro_batches
        p.loss_sum = res.loss_sum  # went on from the saved sum: the same additions as an uninterrupted run
        self.bar.set_postfix(
            epoch=f"{p.epoch + 1}/{self.plan['epochs']}",
            loss=f"{loss:.3f}",
            img_s=f"{res.images * d.world_size / max(res.seconds, 1e-9):.0f}",
            lr=f"{self.opt.scheduler.get_last_lr()[0]:.2e}",
        )
        self.bar.update(1)
        eta = self.eta.after_step(steps_this_run=p.steps_this_run, step=p.step, wall_s=self._wall_s())
        if eta and d.is_main:
            self.bar.line(eta)
        if self.head_warmup is not None and self.head_warmup.after_step(p.step):
            self.bar.line(f"head warmup done after {p.step} steps: training every weight from here")  # 1 process
        new = self.replan.after_step(
            steps_this_run=p.steps_this_run, step=p.step, planned=self.plan["total_steps"], dist=d, device=self.device
        )
        if new is not None:
            self._replanned(*new)
        self._token_drop_phase()
        stop = p.step >= self.plan["total_steps"]
        stop |= cfg.stop_after is not None and p.steps_this_run >= cfg.stop_after
        periodic = cfg.save_every is not None and time.perf_counter() - self.last_save >= 60 * cfg.save_every
        signalled, periodic = any_rank([self.stop.requested, periodic], d)  # ranks' clocks differ: decide together
        stop |= signalled
        if (stop or periodic) and p.micro < self.loaders.micro_per_epoch:  # mid-epoch: save the exact position
            self._checkpoint(micro_done=p.micro)
        return stop

    def _replanned(self, total: int, per_step: float, *, late: bool = False) -> None:
        """Re-fit the schedule to end at ``total``: the warmup with the cosine, unless the run has finished its
        warmup (at an epoch's end, ``late``): then it is kept, at most half the run, and the LR decays faster
        from where it is."""
        warm, _ = warmup_for(self.cfg.recipe, total_steps=total, steps_per_epoch=self.loaders.steps_per_epoch)
        if late and self.progress.step >= self.plan["warmup_steps"]:
            warm = min(self.plan["warmup_steps"], total // 2)
        which = "the last epoch's steps took" if late else "the run's own steps take"
        self.log(
            f"\ntime budget: {which} {per_step * 1000:.0f} ms -> re-planned to {total} steps "
            f"(was {self.plan['total_steps']}), warmup {warm} steps"
        )
        self.plan["total_steps"] = total
        self.plan["warmup_steps"] = warm
        self.plan["epochs"] = max(1, math.ceil(total / self.loaders.steps_per_epoch))
        self.opt.set_total_steps(total, warmup_steps=warm)  # warmup and cosine re-fitted together to the new end
        self.bar.set_total(total)

    def _end_epoch(self, res: EpochResult) -> None:
        """Evaluate, append the epoch's row to ``metrics.jsonl``, save ``model/`` (when better, or
        with ``--keep last``) and ``last.pt``, redraw the figures now and then."""
        p, cfg, d = self.progress, self.cfg, self.dist
        ev = self.objective.evaluate(
            self.eval_model, self._eval_batches(), device=self.device, amp_dtype=self.amp_dtype, dist=d
        )
        self.last_eval = ev
        row = {
            "epoch": p.epoch + 1,
            "step": p.step,
            "train_loss": p.loss_sum / max(p.micro, 1),
            "lr": self.opt.scheduler.get_last_lr()[0],
            "top1": ev["top1"],
            "top5": ev["top5"],
            "eval_loss": ev["loss"],
            "images_per_sec": res.images * d.world_size / max(res.seconds, 1e-9),
            "wall_s": self._wall_s(),
        }
        if res.skipped:
            row["nan_skipped"] = res.skipped
        improved = ev["top1"] > p.best  # the same on every rank: the evaluation's counts are summed over ranks
        exported = self._exportable() if improved or cfg.keep == "last" else None  # (a collective with --fsdp)
        p.best = max(p.best, ev["top1"])
        p.finish_epoch()
        self.bar.set_postfix(
            epoch=f"{p.epoch}/{self.plan['epochs']}", top1=f"{100 * row['top1']:.1f}%", loss=f"{row['train_loss']:.3f}"
        )
        if d.is_main:
            self.bar.line(report.epoch_line(row, epochs=self.plan["epochs"], num_classes=self.data.num_classes))
            report.append_metrics(row, self.out / "metrics.jsonl")
            if exported is not None:
                report.save_run_model(exported, self.out / "model", cfg=cfg, ev=ev, epoch=p.epoch)
        self._checkpoint(micro_done=0)
        if d.is_main and time.perf_counter() - self.last_plot > 30:  # the end of the run always draws them
            report.draw_figures(self.out, self.data.class_names, ev)
            self.last_plot = time.perf_counter()

    def _checkpoint(self, *, micro_done: int) -> None:
        """Save ``last.pt``: ``micro_done`` micro-batches into the current epoch (0: at its start). A
        collective: every rank calls it (their RNG states are gathered), rank 0 writes the file. With
        ``--fsdp`` every rank first writes its shards of the weights and optimizer state into the
        folder ``last.pt`` then names (:mod:`vitlab.train.dcp`), and older such folders are deleted."""
        sharded = None
        if self.cfg.fsdp:
            sharded = write_sharded(
                self.out,
                net=self.net,
                optimizer=self.opt.optimizer,
                step=self.progress.step,
                d=self.dist,
                device=self.device,
            )
        torch_ranks = gather_torch_rng(self.dist, self.device)
        cuda_ranks = gather_cuda_rng(self.dist, self.device)
        if self.dist.is_main:
            save_checkpoint(
                self.out / "last.pt",
                net=self.net,
                opt=self.opt,
                generator=self.loaders.generator,
                progress=self.progress,
                plan=self.plan,
                cfg=self.cfg,
                wall_s=self._wall_s(),
                micro_done=micro_done,
                torch_ranks=torch_ranks,
                cuda_ranks=cuda_ranks,
                data_fingerprint=self.data_fingerprint,
                sharded=sharded,
            )
            if sharded is not None:
                prune(self.out, keep=sharded)
        self.last_save = time.perf_counter()

    def _wall_s(self) -> float:
        """Wall seconds of the whole run: earlier processes' and this one's."""
        return self.progress.wall_before + time.perf_counter() - self.t_start

    def _finish(self) -> dict[str, Any]:
        p, d, out = self.progress, self.dist, self.out
        rows = report.read_metrics(out / "metrics.jsonl") if d.is_main else []
        summary = report.run_summary(
            progress=p,
            plan=self.plan,
            cfg=self.cfg,
            model=self.model,
            data=self.data,
            processes=d.world_size,
            device=self.device,
            out=out,
            wall_s=self._wall_s(),
            rows=rows,
        )
        if p.interrupted and self.stop.requested:
            summary["signal"] = self.stop.name
        if not p.interrupted and self.objective.uses_labels:
            r, budget = self.cfg.recipe, self.cfg.time_budget
            summary["advice"] = advice_line(rows, recipe=r, epochs=self.plan["epochs"], time_budget=budget)
        if d.is_main:
            report.write_json(summary, out / "summary.json")
            if summary.get("advice"):
                self.log(summary["advice"])
            if self.last_eval is not None:
                report.draw_figures(out, self.data.class_names, self.last_eval)
            if p.interrupted:
                by = f" by {self.stop.name}" if self.stop.requested else ""
                self.log(
                    f"stopped{by} at epoch {p.epoch + 1}, step {p.step}; saved {out / 'last.pt'}. "
                    f"Continue with: vitlab train --out {out} --resume"
                )
        return summary
