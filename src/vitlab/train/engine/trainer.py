"""The :class:`Trainer`: one process's part of one run, from its first step to its summary. Everything it trains
with is built before (:mod:`.run`); it trains the planned epochs (or until asked to stop), evaluates, saves and
writes the run's outputs."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._progress import ProgressLog
from ...adapters import merged_copy
from ...distributed import Dist, any_rank
from ...errors import NonFiniteLossError
from ...evaluate.calibration import calibrate
from ...models.layers import set_patch_drop
from ...track import FanOut, make_trackers
from ..conf.phases import ends_dropping
from ..conf.train_config import TrainConfig
from ..objectives import Objective
from ..persist.advice import advice_line
from ..persist.figures import draw_run_figures, redraw_due
from ..persist.health import row_scalars
from ..persist.outputs import (
    append_metrics,
    epoch_row,
    read_metrics,
    run_summary,
    write_config,
    write_json,
    write_sizing,
)
from ..persist.position import RunPosition
from ..persist.saver import CheckpointSaver
from ..sizing.budget import Replanner
from ..sizing.choice import Sizing
from ..sizing.finetune import given_method_advice
from ..sizing.machine import ThreadWatch
from ..sizing.pace import train_step_macs
from ..sizing.steps import Replan, RunPlan
from .loaders import RunLoaders
from .loop import EpochResult, StepParts, train_epoch
from .messages import WallEstimate, before_line, epoch_line, start_line, stopped_line
from .model import HeadOnly
from .navit import packed_counts, packed_metrics
from .optim import Optimization
from .parallel import full_model, lockstep
from .run_data import data_record
from .schedule import Step, StepSchedule
from .signals import StopSignals
from .watch import AttentionWatch, measure_epoch, run_context

__all__ = ["Trainer"]


@dataclass(kw_only=True)
class Trainer:
    """One process's part of one run. ``net`` is what the optimiser trains and ``last.pt`` saves (the ViT, or the
    objective's module around it); ``train_net`` is how the steps call it (inside DDP or FSDP, compiled);
    ``eval_net`` is what evaluation and ``model/`` read (the EMA's average, or ``net``). ``cfg`` is what the run was
    asked, ``sizing`` what it chose (its recipe is the one trained with); ``plan`` the steps planned now (a time
    budget moves it). Where the run is, is one object: :attr:`position`."""

    cfg: TrainConfig
    sizing: Sizing
    dist: Dist
    device: torch.device
    out: Path
    data: Any
    objective: Objective
    net: nn.Module
    train_net: nn.Module
    loaders: RunLoaders
    opt: Optimization
    schedule: StepSchedule
    plan: RunPlan
    replan: Replanner
    position: RunPosition
    saver: CheckpointSaver
    amp_dtype: torch.dtype | None = None
    stop: StopSignals | None = None
    log: Callable[..., None] = print
    t_start: float = field(default_factory=time.perf_counter)
    data_fingerprint: dict[str, Any] | None = None
    init_line: str | None = None
    resumed: bool = False
    # what the run keeps track of as it goes
    eval_net: nn.Module = field(init=False)
    bar: ProgressLog = field(init=False)
    eta: WallEstimate = field(init=False)
    threads: ThreadWatch = field(init=False)
    head: HeadOnly | None = field(init=False, default=None)
    last_eval: dict[str, Any] | None = field(init=False, default=None)
    model_eval: dict[str, Any] | None = field(init=False, default=None)  # model/'s weights' (None: not this process's)
    data_rec: dict[str, Any] = field(init=False, default_factory=dict)  # model/'s and summary.json's data record
    last_save: float = field(init=False, default_factory=time.perf_counter)
    last_plot: float = field(init=False, default_factory=time.perf_counter)
    watch: AttentionWatch = field(init=False)
    tracker: FanOut = field(init=False, default_factory=FanOut)

    def __post_init__(self) -> None:
        self.eval_net = self.opt.ema.module if self.opt.ema is not None else self.net
        macs = train_step_macs(self.vit.macs(), self.loaders.micro)  # a training step's
        self.threads = ThreadWatch.for_run(self.cfg, device=self.device, step_macs=macs,
                                           replayed=self.sizing.replayed is not None)  # fmt: skip
        self.data_rec = data_record(self.cfg, self.data, self.data_fingerprint)

    @property
    def vit(self) -> nn.Module:
        """The ViT the run trains."""
        return self.objective.exported(self.net)

    def run(self) -> dict[str, Any]:
        """Train the planned epochs (or until stopped), then write the summary and figures."""
        p = self.position
        with contextlib.ExitStack() as scope:
            if self.stop is None:  # constructed on its own, not by fit()
                self.stop = scope.enter_context(StopSignals(single_process=not self.dist.enabled))
            self._start_trackers()  # still starting: a stop signal while a tracker's server is silent ends the run
            scope.callback(self.tracker.close)
            self._begin()
            self.bar = ProgressLog(total=self.plan.total_steps, initial=p.step, desc="train",
                                   enabled=self.cfg.progress, silent=not self.dist.is_main)  # fmt: skip
            self._enter(self.schedule.lookup(p.step))
            try:
                while p.epoch < self.plan.epochs and p.step < self.plan.total_steps and self._epoch():
                    pass
            except NonFiniteLossError as e:
                raise NonFiniteLossError(
                    f"{e}, global step {p.step + 1}: stopped before that update; {p.kept(self.saver.last)}. "
                    "Lower --lr, set --clip-grad, or pass --on-nan skip"
                ) from None
            finally:
                self.bar.close()
        return self._finish()

    def _start_trackers(self) -> None:
        """``--log``'s trackers (rank 0), before training begins: a tracker whose server does not answer in time
        is off for the run, with one line (``--strict-log``: the run stops in one line); a stop signal meanwhile
        ends the run at once (:class:`~vitlab.train.engine.signals.StoppedBeforeTraining`; under torchrun the
        wait ends and the ranks stop after their first step)."""
        if not self.dist.is_main or not self.cfg.log:
            return
        stop = self.stop
        config = {**self.cfg.to_dict(), "sizing": self.sizing.to_dict()}  # what was asked, what was chosen
        self.tracker = make_trackers(self.cfg.log, out=self.out, config=config, strict=self.cfg.strict_log,
                                     stop=lambda: stop.name if stop is not None else None, warn=self.log)  # fmt: skip

    def _begin(self) -> None:
        """Ready: from now on a stop signal saves (the first step then stops). The lines a run starts with."""
        self.stop.training()  # type: ignore[union-attr]
        if self.schedule.lookup(self.position.step).head_only:  # after the optimizer, which holds every parameter
            self.head = HeadOnly.hold(self.vit, distributed=self.dist.enabled, what=self.sizing.recipe.tuning_what())
        if self.init_line:
            self.log(self.init_line)
            if not self.resumed and self.objective.uses_labels:  # a collective under torchrun
                self.log(before_line(self._evaluate(), size=self.vit.config.img_size, split=self.data.val_name))
        if self.dist.is_main:
            write_config(self.cfg, self.out)
            write_sizing(self.out, self.sizing.record(self.cfg, plan=self.plan, fingerprint=self.data_fingerprint))
        rows = read_metrics(self.out / "metrics.jsonl") if self.dist.is_main else []
        context = run_context(self.cfg, self.sizing.recipe, config=self.vit.config, data=self.data, plan=self.plan)
        self.watch = AttentionWatch.start(self.cfg.watch_attention, loaders=self.loaders, vit=self.vit,
                                          context=context, rows=rows, sharded=self.cfg.fsdp)  # fmt: skip
        r, d = self.sizing.recipe, self.dist
        self.log(start_line(self.vit, self.data, r, self.plan, d.world_size, self.device,
                            time_budget=self.cfg.time_budget))  # fmt: skip
        self.eta = WallEstimate(  # a budgeted run knows its end; --pack evaluates the centre crop and the native one
            total_steps=0 if self.cfg.time_budget else self.plan.total_steps, batch_size=r.batch_size, tuning=r.tuning,
            steps_per_epoch=self.loaders.steps_per_epoch, n_eval=len(self.data.val) * self.loaders.evaluations,
        )  # fmt: skip

    def _epoch(self) -> bool:
        """Train (the rest of) one epoch and evaluate it; False when the run stops here."""
        p, lo = self.position, self.loaders
        p.start_epoch()
        self.watch.epoch_began()
        parts = StepParts(
            net=self.train_net, objective=self.objective, opt=self.opt, recipe=self.sizing.recipe, device=self.device,
            amp_dtype=self.amp_dtype, mix=lo.mix, on_nan=self.cfg.on_nan, dist=self.dist,
        )  # fmt: skip
        res = train_epoch(parts, lo.train_batches(p.epoch, p.micro), on_step=self._on_step, loss_sum=p.loss_sum,
                          step_input=lambda x: lo.step_input(x, side=self.schedule.lookup(p.step).img_size),
                          counted=p.loss_count, packed=(p.tokens, p.slots))  # fmt: skip
        p.train_s += res.seconds
        if res.stopped and p.micro < lo.micro_per_epoch and p.step < self.plan.total_steps:
            p.interrupted = True  # stopped mid-epoch: _on_step saved the exact position
            return False
        t_end = time.perf_counter()
        self._end_epoch(res)
        if res.steps and not res.stopped:
            per_step = res.seconds / res.steps
            new = self.replan.after_epoch(step=p.step, planned=self.plan.total_steps, per_step=per_step,
                                          overhead_s=time.perf_counter() - t_end, dist=self.dist,
                                          device=self.device)  # fmt: skip
            if new is not None:
                self._replanned(new, self.replan.per_step, at="epoch")  # the run's pace the move was made at
                self._checkpoint(micro_done=0)  # last.pt was written with the plan before the move
            if line := self.threads.after_epoch(per_step):
                self.log(line)
        if res.stopped and p.step < self.plan.total_steps:
            p.interrupted = True
            return False
        return True

    def _on_step(self, res: EpochResult, loss: float) -> bool:
        """After each optimizer step: count it, re-plan a time budget once, enter the next step of the schedule,
        decide whether to stop, save mid-epoch when stopping or when ``--save-every`` is due. True: stop the
        epoch here."""
        p, cfg, d = self.position, self.cfg, self.dist
        p.took_step(res, world_size=d.world_size)
        self.bar.set_postfix(
            epoch=f"{p.epoch + 1}/{self.plan.epochs}",
            loss=f"{loss:.3f}" if math.isfinite(loss) else "skipped",
            img_s=f"{res.images * d.world_size / max(res.seconds, 1e-9):.0f}",
            lr=f"{self.opt.scheduler.get_last_lr()[0]:.2e}",
        )
        self.bar.update(1)
        eta = self.eta.after_step(steps_this_run=p.steps_this_run, step=p.step, wall_s=self._wall_s())
        if eta:
            self.bar.line(eta)
        new = self.replan.after_step(steps_this_run=p.steps_this_run, step=p.step, planned=self.plan.total_steps,
                                     dist=d, device=self.device)  # fmt: skip
        if new is not None:
            self._replanned(*new, at="step")
        self._enter(self.schedule.lookup(p.step))
        stop = p.step >= self.plan.total_steps
        stop |= cfg.stop_after is not None and p.steps_this_run >= cfg.stop_after
        periodic = cfg.save_every is not None and time.perf_counter() - self.last_save >= 60 * cfg.save_every
        signalled, periodic = any_rank([self.stop.requested, periodic], d)  # ranks' clocks differ: decide together
        stop |= signalled
        if (stop or periodic) and p.micro < self.loaders.micro_per_epoch:  # mid-epoch: save the exact position
            self._checkpoint(micro_done=p.micro)
        return stop

    def _enter(self, step: Step) -> None:
        """Apply what the step schedule says for the coming step: the end of the head-only phase, the token-drop
        rate, and the objective's phase (the warm start's end; each end said once; the LR is the scheduler's, the
        image size the loop's)."""
        p = self.position
        if self.head is not None and not step.head_only:
            self.bar.line(self.head.release(p.step))  # 1 process
            self.head = None
        switch = self.schedule.token_drop_switch()
        rate = step.token_drop_rate
        changed = ends_dropping(self.sizing.recipe) and (
            set_patch_drop(self.vit, rate) | self.loaders.set_token_drop(rate)
        )
        if changed and switch is not None and p.step >= switch:
            self.bar.line(
                f"token dropping ends after step {p.step} of {self.plan.total_steps}: "
                "every token from here (--token-drop-until)"
            )
        if line := self.objective.enter(self.net, step=p.step, warm_start=step.warm_start):
            self.bar.line(f"{line} (of {self.plan.total_steps} steps)")

    def _replanned(self, total: int, per_step: float, *, at: str) -> None:
        """Re-fit the schedule to end at ``total`` from the current step, the LR continuous there
        (:meth:`~vitlab.train.engine.schedule.StepSchedule.replan_from`). ``at``: after a step, or at an epoch's end
        (the line says so); the move is kept in the plan, so that a replay makes it at the same point."""
        was = self.plan.total_steps
        warm = self.schedule.replan_from(self.position.step, total, steps_per_epoch=self.loaders.steps_per_epoch)
        move = Replan(step=self.position.step, total=total, at=at, per_step=per_step, end_s=self.replan.end_s)
        self.plan = self.plan.replanned(move, warmup_steps=warm)
        self.bar.line(move.line(was=was, warmup=warm, replayed=self.sizing.replayed is not None))  # (above the bar)
        self.bar.set_total(total)

    def _end_epoch(self, res: EpochResult) -> None:
        """Evaluate, append the epoch's row to ``metrics.jsonl``, save ``model/`` (when better, or
        with ``--keep last``) and ``last.pt``, redraw the figures now and then."""
        p, cfg, d = self.position, self.cfg, self.dist
        ev = self._evaluate(last=p.step >= self.plan.total_steps, logits=True)
        held = ev.pop("logits", None), ev.pop("labels", None)  # the temperature's fit, not the metrics'
        self.last_eval = ev
        row = epoch_row(p, ev=ev, lr=self.opt.scheduler.get_last_lr()[0], wall_s=self._wall_s(),
                        images_per_sec=res.images * d.world_size / max(res.seconds, 1e-9))  # fmt: skip
        health, watch_lines = measure_epoch(self.watch, self.vit, dist=d, sharded=cfg.fsdp, epoch=p.epoch + 1,
                                            step=p.step)  # fmt: skip
        if health is not None:
            row["attention"] = health
        if self.loaders.packed:
            row |= packed_metrics(
                self.objective, self.eval_net, loaders=self.loaders, position=self.position, dist=d,
                device=self.device, amp_dtype=self.amp_dtype, images_per_sec=row["images_per_sec"],
            )  # fmt: skip
        kept = ev["top1"] > p.best or cfg.keep == "last"  # the same on every rank: the counts are summed over ranks
        exported = cal = None  # model/'s weights (with --fsdp gathered to rank 0: a collective) and its temperature,
        if kept:  # fitted on these weights' own evaluation logits (no extra forward pass)
            vit = self.objective.exported(self.eval_net)
            exported = full_model(vit, d) if cfg.fsdp else vit
            cal = calibrate(*held) if d.is_main and held[0] is not None and len(held[0]) else None
            row.update(cal.scalars() if cal else {})
            self.model_eval = {**ev, "epoch": p.epoch + 1, **({"calibration": cal.to_dict()} if cal else {})}
        p.best = max(p.best, ev["top1"])
        p.finish_epoch()
        loss = row["train_loss"]
        self.bar.set_postfix(
            epoch=f"{p.epoch}/{self.plan.epochs}", top1=f"{100 * row['top1']:.1f}%",
            loss=f"{loss:.3f}" if loss is not None else "skipped",
        )  # fmt: skip
        if d.is_main:
            self.bar.line(epoch_line(row, epochs=self.plan.epochs, num_classes=self.data.num_classes))
            for line in watch_lines:
                self.bar.line(line)
            append_metrics(row, self.out / "metrics.jsonl")
            self.tracker.log(row["step"], row_scalars(row))
            if exported is not None:
                self.saver.save_model(exported, cfg=cfg, recipe=self.sizing.recipe, ev=ev, epoch=p.epoch,
                                      data=self.data_rec, calibration=cal)  # fmt: skip
        self._checkpoint(micro_done=0)
        if d.is_main and redraw_due(since_last=time.perf_counter() - self.last_plot, left=self.replan.seconds_left()):
            self._draw()
            self.last_plot = time.perf_counter()

    def _checkpoint(self, *, micro_done: int) -> None:
        """Save ``last.pt`` (a collective): ``micro_done`` micro-batches into the current epoch (0: at its start)."""
        self.saver.save(
            net=self.net, opt=self.opt, generator=self.loaders.generator, position=self.position, plan=self.plan,
            cfg=self.cfg, sizing=self.sizing, wall_s=self._wall_s(), micro_done=micro_done,
            data_fingerprint=self.data_fingerprint,
            packed=packed_counts(self.position, self.loaders, self.dist) if micro_done else (0, 0),
        )  # fmt: skip
        self.last_save = time.perf_counter()

    def _evaluate(self, *, last: bool = False, logits: bool = False) -> dict[str, Any]:
        """Evaluate ``eval_net`` on this rank's evaluation batches (``--fsdp``: in step with the other ranks',
        :func:`~.parallel.lockstep`); ``logits``: with the logits and labels (every rank's), for the temperature.
        A net with LoRA or SSF adapters is evaluated as a merged copy (:func:`vitlab.adapters.merged_copy`): the model
        ``model/`` holds, on the inference speed paths a wrapped layer keeps the plain forward from."""
        batches = self.loaders.eval_batches()
        net = self.eval_net
        if self.cfg.fsdp:
            batches = lockstep(batches, net=net, d=self.dist, device=self.device, amp_dtype=self.amp_dtype,
                               config=self.vit.config)  # fmt: skip
        else:
            net = merged_copy(net)
        return self.objective.evaluate(net, batches, device=self.device, amp_dtype=self.amp_dtype, dist=self.dist,
                                       last=last, logits=logits)  # fmt: skip

    def _wall_s(self) -> float:
        """Wall seconds of the whole run: earlier processes' and this one's."""
        return self.position.wall_before + time.perf_counter() - self.t_start

    def _finish(self) -> dict[str, Any]:
        p, d, out = self.position, self.dist, self.out
        rows = read_metrics(out / "metrics.jsonl") if d.is_main else []
        summary = run_summary(
            position=p, plan=self.plan, cfg=self.cfg, sizing=self.sizing, model=self.vit, data=self.data,
            processes=d.world_size, device=self.device, out=out, wall_s=self._wall_s(), rows=rows,
            data_record=self.data_rec, model_eval=self.model_eval,
        )  # fmt: skip
        if p.interrupted and self.stop.requested:  # type: ignore[union-attr]
            summary["signal"] = self.stop.name  # type: ignore[union-attr]
        summary["attention"] = att = self.watch.summary()
        if not p.interrupted and self.objective.uses_labels:
            r = self.sizing.recipe
            method = given_method_advice(self.cfg, r.tuning, n_train=len(self.data.train),
                                         params=self.vit.config.num_params())  # fmt: skip
            summary["advice"] = advice_line(rows, recipe=r, epochs=self.plan.epochs, time_budget=self.cfg.time_budget,
                                            n_eval=len(self.data.val), alarms=att["alarms"], notes=att["notes"],
                                            method=method, given=self.cfg.recipe_given)  # fmt: skip
        if d.is_main:
            self._draw()  # before summary.json, written last: a finished run's outputs are whole once it is there
            write_json(summary, out / "summary.json")
            if summary.get("advice"):
                self.log(summary["advice"])
            if p.interrupted:
                self.log(stopped_line(p, by=summary.get("signal"), saved=self.saver.last, out=out))
        return summary

    def _draw(self) -> None:
        draw_run_figures(self.out, self.data.class_names, self.data.val_name, model_eval=self.model_eval,
                         last_eval=self.last_eval)  # fmt: skip
