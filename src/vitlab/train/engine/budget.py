"""``--time-budget``: plan the number of optimizer steps from a measured step time, re-plan once from the run's own
steps, then follow the pace both ways (a slower stretch shortens the plan, a faster one lengthens it), so that the
run ends on time, neither early nor late. The arithmetic is :mod:`vitlab.train.spec.pace`'s."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..._units import counted
from ...distributed import Dist, broadcast_ints
from ..objectives import Objective
from ..persist.position import RunPlan
from ..spec.config import TrainConfig
from ..spec.pace import LOGGING_SHARE, SAVE_S, Pace, budget_reserve, short_budget_line, steps_in_budget
from . import calibrate
from .loaders import RunLoaders
from .optim import build_optimizer
from .schedule import StepSchedule, ends_dropping, last_stretch_from, set_rate, unmasked_phases, warmup_for

__all__ = ["REPLAN_AT", "Replanner", "budget_reserve", "measure_budget", "plan_run", "steps_in_budget"]

REPLAN_FROM, REPLAN_AT = 5, 45
"""A time-budgeted run times its own optimizer steps ``REPLAN_FROM`` to ``REPLAN_AT`` and re-plans once from that."""
_TOLERANCE = 0.03
"""A later correction moves the plan only when it changes the steps still to go by more than this share (and by
more than 1% of the budget's time): the pace of one epoch to the next varies by a little, and every move re-shapes
the rest of the decay."""


def _reusable(pace: Pace | None, cfg: TrainConfig, loaders: RunLoaders) -> bool:
    """Whether the recipe's probe timed this run's very step (the same model, batch and token dropping, in eager
    mode, one step a batch): its step time is then reused rather than measured again."""
    r = cfg.recipe
    return (
        pace is not None
        and not cfg.compile
        and not cfg.pack
        and not ends_dropping(r)
        and not cfg.model
        and not cfg.init
        and r.accum_steps == 1
        and r.optimizer in ("adamw", "adam")  # the recipe's probe steps AdamW
        and pace.batch == loaders.micro
        and dict(r.arch) == pace.arch
        and not any(v is not None for v in cfg.arch.values())
    )


def measure_budget(
    cfg: TrainConfig,
    *,
    net: nn.Module,
    run_net: nn.Module,
    loaders: RunLoaders,
    objective: Objective,
    schedule: StepSchedule,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    t_start: float,
    log: Callable[[str], None],
    pace: Pace | None = None,
) -> tuple[int, int, float]:
    """``(steps, epochs, seconds per evaluation)`` that fit ``cfg.time_budget``: time a few throw-away steps of the
    objective on a copy of the model (so the real run's RNG and weights are untouched), then subtract evaluations
    (timed on up to 256 images, an evaluation batch at a time as the run evaluates). The step time less the
    optimizer's update (timed alone: Muon's does not shrink with the image) is multiplied by the schedule's mean
    cost (:meth:`~vitlab.train.engine.schedule.StepSchedule.mean_cost`): the probe times the final size, dropping
    tokens, and with ``--token-drop-until`` it times a step on every token too. When the
    recipe's own probe (``pace``, :mod:`~vitlab.train.engine.calibrate`) timed this very step, its step and
    evaluation times are used instead, so that the plan is the one the recipe was chosen for. The augmentation is
    timed on the run's transform: added to each step without workers, beside it with them.
    When the plan is no meaningful run, a line says so and proposes a budget (:func:`~.pace.short_budget_line`).

    With ``--compile`` the steps run through the real compiled model instead (its compilation is then paid, and
    counted, here, and the per-step time is the compiled one), with a zero-LR copy of the run's optimizer of its
    own: a step of AdamW, SGD or Muon at LR 0 leaves every weight bit-identical."""
    r, micro, spe = cfg.recipe, loaders.micro, loaders.steps_per_epoch
    reuse = _reusable(pace, cfg, loaders)
    full_over_dropped, unmasked = 1.0, ends_dropping(r)
    with torch.random.fork_rng(devices=[]):
        t0 = time.perf_counter()  # data loading + augmentation of one micro-batch
        items = loaders.train_items(micro)
        aug_s = (time.perf_counter() - t0) * r.accum_steps
        if reuse:
            step_s, eval_s = pace.step_s, pace.eval_s * objective.eval_passes * loaders.evaluations  # type: ignore[union-attr]
            update_s = 0.0  # the recipe's probe timed whole steps; its fixed share is the schedule's
        else:
            step_s, update_s, full_over_dropped, eval_s = _probe(
                cfg, net=net, run_net=run_net, loaders=loaders, items=items, objective=objective, device=device,
                amp_dtype=amp_dtype, unmasked=unmasked,
            )  # fmt: skip
    update_s = min(update_s, step_s)
    compute = update_s + (step_s - update_s) * schedule.mean_cost(full_over_dropped=full_over_dropped)
    per_step = (compute + aug_s if loaders.workers == 0 else max(compute, aug_s / loaders.workers)) * LOGGING_SHARE
    left = cfg.time_budget - (time.perf_counter() - t_start) - budget_reserve(cfg.time_budget)  # type: ignore[operator]
    left -= eval_s * objective.last_eval_extra  # --tta flip-last: the last evaluation's mirrored pass
    total = steps_in_budget(left, per_step, eval_s, spe)
    epochs = max(1, math.ceil(total / spe))
    log(
        f"time budget {cfg.time_budget:.0f} s: {'the recipe probe measured' if reuse else 'measured'} "
        f"{per_step * 1000:.0f} ms per step"
        + (" on average over the resolution schedule" if r.res_schedule else "")
        + (
            f" with every token for {unmasked_phases(r)} of the steps, at "
            f"{full_over_dropped:.2f}x the time of a step that drops tokens"
            if unmasked
            else ""
        )
        + f" ({r.batch_size / per_step:.0f} img/s incl. augmentation), eval {eval_s:.1f} s "
        f"-> {counted(total, 'step')}, {counted(epochs, 'epoch')}"
    )
    short = short_budget_line(
        budget=cfg.time_budget, left=left, per_step=per_step, eval_s=eval_s, steps_per_epoch=spe, steps=total,  # type: ignore[arg-type]
        n_eval=loaders.eval_size,
    )  # fmt: skip
    if short:
        log(short)
    return total, epochs, eval_s


def _probe(
    cfg: TrainConfig, *, net: nn.Module, run_net: nn.Module, loaders: RunLoaders, items: list, objective: Objective,
    device: torch.device, amp_dtype: torch.dtype | None, unmasked: bool,
) -> tuple[float, float, float, float]:  # fmt: skip
    """``(seconds per optimizer step, seconds of its update alone, cost of an unmasked step over a dropping one,
    seconds per evaluation)``, timed on a copy of the model (the compiled model itself with ``--compile``) with the
    run's optimizer (its kind and parameter groups, at LR 0)."""
    r, micro = cfg.recipe, loaders.micro
    probe = run_net if cfg.compile else copy.deepcopy(net)
    opt = build_optimizer(net if cfg.compile else probe, r, 0.0)  # the run's optimizer: Muon's step costs more
    images = [x for x, _ in items]
    xs = loaders.collate_train(images).to(device)  # a packed batch for --pack, its tokens dropped as the run's
    ys = torch.randint(0, max(1, loaders.num_classes), (micro,), device=device)
    probe.train()
    timed = {"objective": objective, "device": device, "amp_dtype": amp_dtype}
    step_s = calibrate.time_steps(probe, opt, xs, ys, **timed) * r.accum_steps
    update_s = calibrate.time_update(probe, opt, xs, ys, **timed)  # once per optimizer step, whatever the accum
    full_over_dropped = 1.0
    if unmasked:  # time the steps on every token too (and compile them, with --compile)
        set_rate(probe, 0.0)  # the copy, or through the compiled wrapper the model itself
        if loaders.set_token_drop(0.0):  # --pack: the loader drops them
            xs = loaders.collate_train(images).to(device)
        full_over_dropped = calibrate.time_steps(probe, opt, xs, ys, **timed) * r.accum_steps / step_s
        set_rate(probe, r.token_drop)
        loaders.set_token_drop(r.token_drop)
    evaluator = net if cfg.compile else probe  # evaluation runs eager: no second compilation for its batch shape
    evaluator.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        n_eval = min(loaders.eval_size, 256)
        for start in range(0, n_eval, loaders.eval_batch):
            evaluator(torch.stack(loaders.eval_items(start, min(n_eval, start + loaders.eval_batch))).to(device))
    eval_s = (time.perf_counter() - t0) * loaders.eval_size / max(1, n_eval)
    eval_s *= objective.eval_passes * loaders.evaluations  # flip TTA: two passes; --pack: two evaluations
    return step_s, update_s, full_over_dropped, eval_s


def plan_run(
    cfg: TrainConfig,
    *,
    net: nn.Module,
    run_net: nn.Module,
    loaders: RunLoaders,
    objective: Objective,
    schedule: StepSchedule,
    lr: float,
    dist: Dist,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    t_start: float,
    log: Callable[[str], None],
    pace: Pace | None = None,
) -> tuple[RunPlan, Replanner]:
    """A new run's plan (saved in ``last.pt``) and its :class:`Replanner`: the recipe's epochs, or as many steps as
    ``--time-budget`` allows (:func:`measure_budget`; ``pace``: the recipe's probe, when there was one). The warmup
    is capped at half the run; every rank gets rank 0's plan. ``t_start``: ``time.perf_counter()`` when this process
    started the run."""
    spe = loaders.steps_per_epoch
    epochs, total, eval_s = cfg.recipe.epochs, cfg.recipe.epochs * spe, 0.0
    if cfg.time_budget:
        total, epochs, eval_s = measure_budget(
            cfg, net=net, run_net=run_net, loaders=loaders, objective=objective, schedule=schedule, device=device,
            amp_dtype=amp_dtype, t_start=t_start, log=log, pace=pace,
        )  # fmt: skip
    warm, wanted = warmup_for(cfg.recipe, total_steps=total, steps_per_epoch=spe)
    if warm < wanted:
        log(f"note: warmup {wanted} steps capped at half the run ({warm} steps)")
    epochs, total, warm = broadcast_ints([epochs, total, warm], dist, device)
    plan = RunPlan(epochs=epochs, total_steps=total, steps_per_epoch=spe, warmup_steps=warm, lr=lr)
    replan = Replanner()
    if cfg.time_budget:  # due or not from the shared plan: its re-plan is a collective
        replan = Replanner.for_plan(
            total_steps=total,
            budget=cfg.time_budget,
            t_start=t_start,
            eval_s=eval_s,
            steps_per_epoch=spe,
            last_extra=objective.last_eval_extra,
        )
        if last := last_stretch_from(cfg.recipe):  # the first steps cost otherwise (smaller sizes, the warm start,
            replan.last_size_from = last  # token dropping): the plan is re-fitted once the last stretch has begun,
            replan.due = replan.late = (1 - last) * total >= 2 * REPLAN_AT  # and followed from there
    return plan, replan


@dataclass(kw_only=True)
class Replanner:
    """Keeps a time-budgeted run's plan on its budget. The planning probe times bare steps on a fixed batch; the
    run's own steps add data loading, clipping, the real optimizer and the machine's load of the moment. So a long
    run times its own steps ``REPLAN_FROM`` to ``REPLAN_AT`` of this process and re-fits the schedule to that pace
    once (with ``--res-schedule``, once its last size has begun: :attr:`last_size_from`). After that the pace is
    followed both ways: at each epoch's end (and, in epochs of many steps, every
    :attr:`check_every` steps) the steps still to go are re-fitted to what the latest pace, the evaluations still
    to come and the time left allow, shorter when the machine slowed, longer when it recovered, when that moves
    the plan by more than :data:`_TOLERANCE`. The time left is read from the clock, so time lost to a slow stretch
    is made up by the steps that follow at the recovered pace, and the run ends on its budget. Each move re-fits
    the LR schedule from the current step without a jump (:meth:`~vitlab.train.engine.schedule.LRFactor.refit_from`)."""

    due: bool = False
    """Whether the early re-plan is still to come: False for runs without a time budget, short ones and resumed
    ones."""
    late: bool = False
    """Whether to follow the pace after the early re-plan: fresh time-budgeted runs, but not those whose last
    stretch of one step cost (:attr:`last_size_from`) is too short to be timed."""
    budget: float = 0.0
    t_start: float = 0.0
    """``time.perf_counter()`` when this process started the run."""
    eval_s: float = 0.0
    """Seconds of an evaluation (the probe's, then each epoch's end-of-epoch work as measured)."""
    last_extra: float = 0.0
    """What the run's last evaluation costs beyond the others', in evaluations (``Objective.last_eval_extra``)."""
    steps_per_epoch: int = 1
    check_every: int = 0
    """Steps between the checks within an epoch (0: at epoch ends only)."""
    t0: float = 0.0
    mark: tuple[int, float] | None = None
    """``(step, clock)`` where the current stretch of steps began (after the early re-plan, each check and each
    epoch's end-of-epoch work)."""
    last_size_from: float = 0.0
    """The share of the plan where its last stretch of one step cost begins (:func:`~.schedule.last_stretch_from`:
    the last size of ``--res-schedule``, the warm start's or the token dropping's end; 0: every step costs the
    same). The steps before it do not tell the pace of the later ones, so the early re-plan times the steps
    ``REPLAN_FROM`` to ``REPLAN_AT`` of the last stretch, an epoch begun before them is not a pace, and no new plan
    is so long that a step would go back to an earlier stretch."""
    followed_from: int = 0
    """The step of the early re-plan: epochs that began before it are not a pace (:meth:`after_epoch`)."""
    epoch_start: int = 0
    """The step at which the current epoch began."""

    @classmethod
    def for_plan(
        cls, *, total_steps: int, budget: float, t_start: float, eval_s: float, steps_per_epoch: int,
        last_extra: float = 0.0,
    ):  # fmt: skip
        """A replanner for a fresh time-budgeted plan of ``total_steps`` (due only if the run is long enough)."""
        return cls(
            due=total_steps >= 2 * REPLAN_AT,
            late=True,
            budget=budget,
            t_start=t_start,
            eval_s=eval_s,
            last_extra=last_extra,
            steps_per_epoch=steps_per_epoch,
            check_every=max(REPLAN_AT - REPLAN_FROM, steps_per_epoch // 4) if steps_per_epoch >= 160 else 0,
        )

    def after_step(
        self, *, steps_this_run: int, step: int, planned: int, dist: Dist, device: torch.device
    ) -> tuple[int, float] | None:
        """Called after every optimizer step: ``(new total steps, measured seconds per step)`` when the plan should
        change (the early re-plan by more than 2 %; a check within an epoch as :meth:`after_epoch`), else None."""
        if self.due:
            since = step - math.ceil(self.last_size_from * planned) if self.last_size_from else steps_this_run
            return self._early(since=since, step=step, planned=planned, dist=dist, device=device)
        if not (self.late and self.check_every and self.mark is not None and step < planned):
            return None
        if step - self.mark[0] < self.check_every:
            return None
        now = time.perf_counter()
        per_step = (now - self.mark[1]) / (step - self.mark[0])
        self.mark = (step, now)
        total = self._refit(step=step, planned=planned, per_step=per_step, now=now, dist=dist, device=device)
        return None if total is None else (total, per_step)

    def _early(
        self, *, since: int, step: int, planned: int, dist: Dist, device: torch.device
    ) -> tuple[int, float] | None:
        """The early re-plan: ``since`` steps of this process (of the last size, with a resolution schedule)."""
        if since == REPLAN_FROM:
            self.t0 = time.perf_counter()
            return None
        if since != REPLAN_AT:
            return None
        now = time.perf_counter()
        per_step = (now - self.t0) / (REPLAN_AT - REPLAN_FROM) * 1.02
        self.mark, self.followed_from = (step, now), step
        left = self._left(now)
        total = self._capped(step, step + steps_in_budget(left, per_step, self.eval_s, self.steps_per_epoch, step))
        (total,) = broadcast_ints([total], dist, device)
        self.due = False
        if abs(total - planned) <= 0.02 * planned:
            return None
        return total, per_step

    def after_epoch(
        self, *, step: int, planned: int, per_step: float, overhead_s: float, dist: Dist, device: torch.device
    ) -> int | None:
        """Called at each epoch's end, after its evaluation and saving (``overhead_s`` for them, ``per_step``
        seconds for each of its optimizer steps): the new total when the steps that fit in the budget at this
        epoch's pace differ from the plan's by more than :data:`_TOLERANCE` of the steps still to go (and by 1% of
        the budget's time), shorter or longer, else None. Not before the early re-plan, nor once the plan is done
        (its decay has ended: more steps would train at its last LR)."""
        now = time.perf_counter()
        began, self.epoch_start = self.epoch_start, step
        if self.due:
            self.t0 += overhead_s  # the early re-plan times steps: an epoch end inside its window is not one
        if not self.late or self.due:
            return None
        self.mark = (step, now)
        self.eval_s = max(0.0, overhead_s - SAVE_S)  # steps_in_budget adds the saving to each evaluation
        if step >= planned or (self.last_size_from and began < self.followed_from):
            return None  # done, or an epoch begun at a smaller size or before its last size was timed
        return self._refit(step=step, planned=planned, per_step=per_step, now=now, dist=dist, device=device)

    def _capped(self, step: int, total: int) -> int:
        """``total``, or with a last stretch at most the longest plan that keeps every step from ``step`` on in it
        (its start is a share of the plan: a longer one moves it later)."""
        return min(total, int(step / self.last_size_from)) if self.last_size_from else total

    def _left(self, now: float) -> float:
        """Seconds left for steps and evaluations at ``now``: the budget less the time spent, the reserve and the
        last evaluation's extra cost."""
        return self.budget - (now - self.t_start) - budget_reserve(self.budget) - self.eval_s * self.last_extra

    def _refit(
        self, *, step: int, planned: int, per_step: float, now: float, dist: Dist, device: torch.device
    ) -> int | None:
        """The new total at ``per_step`` seconds a step from ``now`` on (rank 0's, on every rank), or None when it
        is within the tolerance of ``planned``."""
        left = self._left(now)
        more = 0 if left < per_step + self.eval_s else steps_in_budget(left, per_step, self.eval_s,
                                                                       self.steps_per_epoch, step)  # fmt: skip
        total, pace_us = broadcast_ints([self._capped(step, step + more), round(per_step * 1e6)], dist, device)
        slack = max(_TOLERANCE * (planned - step), 0.01 * self.budget / max(pace_us / 1e6, 1e-9))
        if abs(total - planned) <= slack:
            return None
        return total
