"""``--time-budget``: plan the number of optimizer steps from a measured step time, re-plan once
from the run's own steps, then correct the plan at each epoch's end, so that the run ends on time."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..._units import counted
from ...devices import autocast
from ...distributed import Dist, broadcast_ints
from ..objectives import Objective
from ..persist.position import RunPlan
from ..spec.config import TrainConfig
from .loaders import RunLoaders
from .schedule import StepSchedule, ends_dropping, set_rate, warmup_for

__all__ = ["REPLAN_AT", "Replanner", "budget_reserve", "measure_budget", "plan_run", "steps_in_budget"]

REPLAN_FROM, REPLAN_AT = 5, 45
"""A time-budgeted run times its own optimizer steps ``_REPLAN_FROM`` to ``_REPLAN_AT`` and re-plans once from that."""
_LATE_TOLERANCE = 0.03
"""An epoch-end correction moves the plan only when it would cut the steps still to go by more than this share:
the pace of one epoch to the next varies by a little, and every move re-shapes the rest of the cosine."""


def budget_reserve(budget: float) -> float:
    """Seconds kept back from a time budget for the final save and figures."""
    return min(5.0, 0.1 * budget)


def steps_in_budget(left: float, per_step: float, eval_s: float, steps_per_epoch: int, done: int = 0) -> int:
    """How many more optimizer steps fit in ``left`` seconds after ``done`` steps: ``per_step`` each,
    plus one evaluation (``eval_s``, plus 0.5 s for saving) at the end of every epoch they finish or start.

    The answer is the largest ``n`` from 1 to ``left / per_step`` whose cost fits (1 when none does). The cost
    grows with ``n`` (in floating point too: rounding is monotonic), so a bisection finds it in O(log n) steps:
    a budget of years plans as fast as one of minutes."""

    def cost(n: int) -> float:
        return n * per_step + (math.ceil((done + n) / steps_per_epoch) - done // steps_per_epoch) * (eval_s + 0.5)

    lo, hi = 1, max(1, int(left / per_step))  # cost(lo) fits, or lo is the answer anyway; the answer is <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) > left:
            hi = mid - 1
        else:
            lo = mid
    return lo


def _time_steps(
    probe, opt, xs, ys, *, objective: Objective, device, amp_dtype, n_warm: int = 2, n_time: int = 5
) -> float:
    """Seconds per training step of ``probe`` on the batch ``(xs, ys)``, the objective's loss: the mean of
    ``n_time`` after ``n_warm``."""
    for i in range(n_warm + n_time):
        if i == n_warm:
            t0 = time.perf_counter()
        with autocast(device, amp_dtype):
            loss = objective.loss(probe, xs, ys)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / n_time


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
) -> tuple[int, int, float]:
    """``(steps, epochs, seconds per evaluation)`` that fit ``cfg.time_budget``: time a few throw-away steps of the
    objective on a copy of the model (so the real run's RNG and weights are untouched), then subtract evaluations
    (timed on up to 256 images, an evaluation batch at a time as the run evaluates). The step time is multiplied by
    the schedule's mean cost (:meth:`~vitlab.train.engine.schedule.StepSchedule.mean_cost`): the probe times the
    final size, dropping tokens, and with ``--token-drop-until`` it times a step on every token too.

    With ``--compile`` the steps run through the real compiled model instead (its compilation is then paid, and
    counted, here, and the per-step time is the compiled one), with a zero-LR optimizer of its own: a step of AdamW
    at LR 0 leaves every weight bit-identical."""
    r, micro, spe = cfg.recipe, loaders.micro, loaders.steps_per_epoch
    probe = run_net if cfg.compile else copy.deepcopy(net)
    opt = torch.optim.AdamW(net.parameters() if cfg.compile else probe.parameters(), lr=0.0)
    full_over_dropped, unmasked = 1.0, ends_dropping(r)
    with torch.random.fork_rng(devices=[]):
        xs = torch.stack([x for x, _ in loaders.train_items(micro)]).to(device)
        ys = torch.randint(0, max(1, loaders.num_classes), (micro,), device=device)
        probe.train()
        timed = {"objective": objective, "device": device, "amp_dtype": amp_dtype}
        step_s = _time_steps(probe, opt, xs, ys, **timed) * r.accum_steps
        if unmasked:  # time the steps on every token too (and compile them, with --compile)
            set_rate(probe, 0.0)  # the copy, or through the compiled wrapper the model itself
            full_over_dropped = _time_steps(probe, opt, xs, ys, **timed) * r.accum_steps / step_s
            set_rate(probe, r.token_drop)
        t0 = time.perf_counter()  # data loading + augmentation of one step, done in this process when workers=0
        loaders.train_items(micro)
        aug_s = (time.perf_counter() - t0) * r.accum_steps if loaders.workers == 0 else 0.0
        evaluator = net if cfg.compile else probe  # evaluation runs eager: no second compilation for its batch shape
        evaluator.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            n_eval = min(loaders.eval_size, 256)
            for start in range(0, n_eval, loaders.eval_batch):
                evaluator(torch.stack(loaders.eval_items(start, min(n_eval, start + loaders.eval_batch))).to(device))
        eval_s = (time.perf_counter() - t0) * loaders.eval_size / n_eval
    del probe, opt, evaluator
    per_step = (step_s + aug_s) * 1.03 * schedule.mean_cost(full_over_dropped=full_over_dropped)  # 3 %: logging
    left = cfg.time_budget - (time.perf_counter() - t_start) - budget_reserve(cfg.time_budget)  # type: ignore[operator]
    total = steps_in_budget(left, per_step, eval_s, spe)
    epochs = max(1, math.ceil(total / spe))
    log(
        f"time budget {cfg.time_budget:.0f} s: measured {per_step * 1000:.0f} ms per step"
        + (" on average over the resolution schedule" if r.res_schedule else "")
        + (
            f" with every token for the last {1 - r.token_drop_until:.0%} of the steps, at "
            f"{full_over_dropped:.2f}x the time of a step that drops tokens"
            if unmasked
            else ""
        )
        + f" ({r.batch_size / per_step:.0f} img/s incl. augmentation), eval {eval_s:.1f} s "
        f"-> {counted(total, 'step')}, {counted(epochs, 'epoch')}"
    )
    return total, epochs, eval_s


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
) -> tuple[RunPlan, Replanner]:
    """A new run's plan (saved in ``last.pt``) and its :class:`Replanner`: the recipe's epochs, or as many steps as
    ``--time-budget`` allows (:func:`measure_budget`). The warmup is capped at half the run; every rank gets rank
    0's plan. ``t_start``: ``time.perf_counter()`` when this process started the run."""
    spe = loaders.steps_per_epoch
    epochs, total, eval_s = cfg.recipe.epochs, cfg.recipe.epochs * spe, 0.0
    if cfg.time_budget:
        total, epochs, eval_s = measure_budget(
            cfg, net=net, run_net=run_net, loaders=loaders, objective=objective, schedule=schedule, device=device,
            amp_dtype=amp_dtype, t_start=t_start, log=log,
        )  # fmt: skip
    warm, wanted = warmup_for(cfg.recipe, total_steps=total, steps_per_epoch=spe)
    if warm < wanted:
        log(f"note: warmup {wanted} steps capped at half the run ({warm} steps)")
    epochs, total, warm = broadcast_ints([epochs, total, warm], dist, device)
    plan = RunPlan(epochs=epochs, total_steps=total, steps_per_epoch=spe, warmup_steps=warm, lr=lr)
    replan = Replanner()
    if cfg.time_budget:  # due or not from the shared plan: its re-plan is a collective
        replan = Replanner.for_plan(
            total_steps=total, budget=cfg.time_budget, t_start=t_start, eval_s=eval_s, steps_per_epoch=spe
        )
        if cfg.recipe.res_schedule:  # the run's first steps are at the smaller sizes: no re-plan from their pace
            replan.due = replan.late = False
        if ends_dropping(cfg.recipe):
            replan.due = False  # its first steps drop tokens; the epoch-end cuts see the unmasked pace later
    return plan, replan


@dataclass(kw_only=True)
class Replanner:
    """The planning probe times bare steps on a fixed batch; the run's own steps add data loading,
    clipping, the real optimizer and the machine's load of the moment. A long time-budgeted run
    times its own steps ``REPLAN_FROM`` to ``REPLAN_AT`` of this process and re-fits the schedule
    to that pace once, still inside the warmup, so that it ends on time. The pace can still drift
    later (the machine's load, a slower phase of the data), so at each epoch's end the steps still
    to go are cut to what the pace and end-of-epoch work leave room for. A cut cannot be undone, so
    the pace it uses is the faster of the last two readings (the early re-plan's and each epoch's):
    a load that slows one epoch and goes away does not shorten the rest of the run; one that stays
    is acted on an epoch later."""

    due: bool = False
    """False for runs without a time budget, short ones and resumed ones."""
    late: bool = False
    """Whether to correct the plan at epoch ends: fresh time-budgeted runs without a resolution schedule (whose
    step cost changes along the run, so one epoch's pace does not predict the next)."""
    budget: float = 0.0
    t_start: float = 0.0
    """``time.perf_counter()`` when this process started the run."""
    eval_s: float = 0.0
    steps_per_epoch: int = 1
    t0: float = 0.0
    last_pace: float | None = None
    """Seconds per step of the previous reading (the early re-plan, then each epoch), for :meth:`after_epoch`."""

    @classmethod
    def for_plan(cls, *, total_steps: int, budget: float, t_start: float, eval_s: float, steps_per_epoch: int):
        """A replanner for a fresh time-budgeted plan of ``total_steps`` (due only if the run is long enough)."""
        return cls(
            due=total_steps >= 2 * REPLAN_AT,
            late=True,
            budget=budget,
            t_start=t_start,
            eval_s=eval_s,
            steps_per_epoch=steps_per_epoch,
        )

    def after_step(
        self, *, steps_this_run: int, step: int, planned: int, dist: Dist, device: torch.device
    ) -> tuple[int, float] | None:
        """Called after every optimizer step: ``(new total steps, measured seconds per step)`` when
        the plan should change (by more than 2 %), else None."""
        if not self.due:
            return None
        if steps_this_run == REPLAN_FROM:
            self.t0 = time.perf_counter()
            return None
        if steps_this_run != REPLAN_AT:
            return None
        now = time.perf_counter()
        per_step = (now - self.t0) / (REPLAN_AT - REPLAN_FROM) * 1.02
        self.last_pace = per_step
        left = self.budget - (now - self.t_start) - budget_reserve(self.budget)
        total = step + steps_in_budget(left, per_step, self.eval_s, self.steps_per_epoch, done=step)
        (total,) = broadcast_ints([total], dist, device)
        self.due = False
        if abs(total - planned) <= 0.02 * planned:
            return None
        return total, per_step

    def after_epoch(
        self, *, step: int, planned: int, per_step: float, overhead_s: float, dist: Dist, device: torch.device
    ) -> int | None:
        """Called at each epoch's end, after its evaluation and saving (``overhead_s`` for them, ``per_step``
        seconds for each of its optimizer steps): the new, shorter total when fewer steps than planned still
        fit in the budget at the faster of this epoch's pace and the previous reading's (by more than
        :data:`_LATE_TOLERANCE`), else None. Not before the early re-plan,
        nor once the plan is done. It never lengthens the run: moving the cosine's end later would raise an
        LR that is already decaying, and ending a little early loses little."""
        if not self.late or self.due or step >= planned:
            return None
        pace = per_step if self.last_pace is None else min(per_step, self.last_pace)
        self.last_pace = per_step
        left = self.budget - (time.perf_counter() - self.t_start) - budget_reserve(self.budget)
        eval_s = max(0.0, overhead_s - 0.5)  # _steps_in_budget adds 0.5 s of saving to each evaluation
        more = 0 if left < pace + eval_s else steps_in_budget(left, pace, eval_s, self.steps_per_epoch, step)
        (total,) = broadcast_ints([step + more], dist, device)
        if planned - total <= _LATE_TOLERANCE * (planned - step):
            return None
        return total
