"""The run's plan (:class:`~.steps.RunPlan`: its epochs and steps) made, and for ``--time-budget`` kept on the
budget: plan the number of optimizer steps from a measured step time (:func:`measure_budget`), re-plan once from the
run's own steps, then follow the pace, both ways, but only beyond a band of it (:class:`Replanner`), so that the run
ends on time with a stable plan. A replayed run (``--config runs/X/config.yaml``) makes X's re-plans at X's steps
instead of measuring (:meth:`Replanner.replaying`). The arithmetic is :mod:`vitlab.train.sizing.pace`'s."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..._units import counted
from ...adapters import merge_adapters
from ...distributed import Dist, broadcast_ints
from ...models.layers import set_patch_drop
from ..conf.phases import ends_dropping, last_stretch_from, mean_cost, unmasked_phases, warmup_for
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig
from .pace import LOGGING_SHARE, Pace, budget_reserve, save_seconds, short_budget_line, steps_in_budget
from .probe import Here, time_steps, time_update
from .side import PHOTO_SIZE
from .steps import Replan, RunPlan

__all__ = ["REPLAN_AT", "Replanner", "measure_budget", "plan_run"]

REPLAN_FROM, REPLAN_AT = 5, 45
"""A time-budgeted run times its own optimizer steps ``REPLAN_FROM`` to ``REPLAN_AT`` and re-plans once from that."""
STRETCH = REPLAN_AT - REPLAN_FROM
"""Steps a stretch of the run must hold before its pace is judged (epochs shorter than this are taken together):
the pace of a few steps, or of one short epoch and its evaluation, is mostly the machine's noise."""
STRETCH_S = 5.0
"""Seconds a stretch must also last (its steps and epoch ends): 40 steps of a tiny model are 2.5 s, whose pace was
10 to 15% off the next stretch's on the 2-core machine, so a 1-minute run moved its plan at nearly every judgment."""
BAND = 0.10
"""After the early re-plan, the plan moves only when the run's pace (:meth:`Replanner._run_pace`) is more than this
share off the pace the plan was made at, or when at that pace the run would end more than this share of the time
left early, or later than the budget's reserve allows (:meth:`Replanner._judge`)."""
CHANGE = 2 * BAND
"""How far off the run's pace a stretch must be to count toward a change of the machine's pace (Page's CUSUM, 1954:
each judged stretch adds how far its log-pace is beyond this, at most this again, :meth:`Replanner._run_pace`); a
change is :data:`EVIDENCE` of it."""
EVIDENCE = 3.5 * BAND
"""The evidence that makes a change: two stretches in a row at 1.5x the run's pace or more (or two thirds of it), three
at 1.4x, so that a halved or doubled speed is followed after two stretches. Stretches swing by 1.5x around a steady
pace on the 2-core machine (a 10-minute fine-tune's tiny steps: 145 to 255 ms within its first minutes; 20% either
side, in turns, moved a plan judged by each stretch alone 52 times in 10 minutes), and seldom twice in a row."""
_TOLERANCE = 0.03
"""A move happens only when it changes the steps still to go by more than this share (and by more than 1% of the
budget's time): re-shaping the rest of the decay for fewer steps than that is not worth a line. In the budget's last
:data:`FINAL`, a plan that would end late by more than the budget's reserve moves whatever its size."""
FINAL = 0.10
"""The share of the budget, at its end, in which the 1% of :data:`_TOLERANCE` no longer holds a plan that would end
late beyond the reserve: a later judgment may not come to correct it. Before, a half-hour run could end up to 15 s past
its budget (1% of it is 18 s, its reserve 5 s): on generated paces (five seeds a machine) it ended at up to 1,808.7 s
where the pace doubled at 40% of the budget, 1,814.9 s where it halved at 85% and 1,807.5 s where it slowed from 30
to 60%; with it at 1,795.9, 1,799.9 and 1,797.6 s, in at most 11, 8 and 13 moves (9, 8 and 12 before). Earlier in
the run the tolerance stands: an end projected a few seconds late there is the pace's noise, which later stretches
correct, and moving at each one made up to 11 moves of a steady half-hour run where this makes 7 (6 before;
docs/training.md, "Re-planning within a band")."""


def _reusable(pace: Pace | None, cfg: TrainConfig, recipe: Recipe, loaders: Any) -> bool:
    """Whether the recipe's probe timed this run's very step (the same model, batch and token dropping, in eager
    mode, one step a batch): its step time is then reused rather than measured again."""
    return (
        pace is not None
        and not cfg.compile
        and not cfg.pack
        and not ends_dropping(recipe)
        and not cfg.model
        and not cfg.init
        and recipe.accum_steps == 1
        and recipe.optimizer in ("adamw", "adam")  # the recipe's probe steps AdamW
        and pace.batch == loaders.micro
        and dict(recipe.arch) == pace.arch
        and not any(v is not None for v in cfg.arch.values())
    )


def measure_budget(
    cfg: TrainConfig, recipe: Recipe, here: Here, *, net: nn.Module, run_net: nn.Module, loaders: Any,
    objective: Any, log: Callable[[str], None], pace: Pace | None = None,
) -> tuple[int, int, float, float, float]:  # fmt: skip
    """``(steps, epochs, seconds per step, seconds per evaluation, seconds of saving an epoch)`` that fit
    ``cfg.time_budget`` for a run of ``recipe``: time a few throw-away steps of the objective on a copy of the model
    (so the real run's RNG and weights are untouched), then subtract the epochs' ends: their evaluations (timed on up
    to 256 images, an evaluation batch at a time as the run evaluates) and their saving (estimated from the model's
    size, :func:`~.pace.save_seconds`, until the run times its own). The step time less the optimizer's update (timed
    alone: Muon's does not shrink with the image) is multiplied by the recipe's mean step cost
    (:func:`~vitlab.train.conf.phases.mean_cost`): the probe times the final size, dropping tokens, and with
    ``--token-drop-until`` it times a step on every token too. When the recipe's own
    probe (``pace``, :func:`~vitlab.train.sizing.probe.measure_pace`) timed this very step, its step and evaluation
    times are used instead, so that the plan is the one the recipe was chosen for. The augmentation is timed on the
    run's transform: added to each step without workers, beside it with them; where the first pass decodes what the
    later ones read kept (tar shards: ``loaders.first_epoch_fills``), on the kept items, the decoding subtracted once
    as the recipe's probe timed it (:attr:`~.pace.Pace.first_pass_s`). A fine-tune's evaluation of the model it
    starts from is subtracted too (a random ViT-B/16 at 128 px: 13 s that a 2-minute run overran by). When the plan
    is no meaningful run, a line says so and proposes what would make one (:func:`~.pace.short_budget_line`).

    ``loaders`` are the run's (:class:`~vitlab.train.engine.loaders.RunLoaders`), ``objective`` its objective (its
    ``loss``, ``eval_passes``, ``last_eval_extra``). With ``--compile`` the steps run through the real compiled model
    instead (its compilation is then paid, and counted, here, and the per-step time is the compiled one), with a
    zero-LR copy of the run's optimizer of its own: a step of AdamW, SGD or Muon at LR 0 leaves every weight
    bit-identical."""
    r, micro, spe = recipe, loaders.micro, loaders.steps_per_epoch
    reuse = _reusable(pace, cfg, r, loaders) and objective.steps_as_probed  # (a teacher's forward: timed here)
    full_over_dropped, unmasked = 1.0, ends_dropping(r)
    kept = pace is not None and loaders.first_epoch_fills and not loaders.packed  # (packed probe items: decoded anew)
    first_s = pace.first_pass_s if kept else 0.0  # type: ignore[union-attr]
    read_s = pace.read_s * micro if pace is not None and first_s else 0.0
    with torch.random.fork_rng(devices=[]):
        t0 = time.perf_counter()  # data loading + augmentation of one micro-batch
        items = loaders.train_items(micro)
        if first_s:  # that reading decoded them, which the first pass pays once: every later one finds them kept
            t0 = time.perf_counter()  # (after reading each sample from its shard, which the recipe's probe timed)
            items = loaders.train_items(micro)
        aug_s = (time.perf_counter() - t0 + read_s) * r.accum_steps
        if reuse:
            step_s, eval_s = pace.step_s, pace.eval_s * objective.eval_passes * loaders.evaluations  # type: ignore[union-attr]
            update_s = 0.0  # the recipe's probe timed whole steps; its fixed share is the schedule's
        else:
            step_s, update_s, full_over_dropped, eval_s = _probe(
                cfg, r, here, net=net, run_net=run_net, loaders=loaders, items=items, objective=objective,
                unmasked=unmasked,
            )  # fmt: skip
    update_s = min(update_s, step_s)
    compute = update_s + (step_s - update_s) * mean_cost(r, full_over_dropped=full_over_dropped)
    per_step = (compute + aug_s if loaders.workers == 0 else max(compute, aug_s / loaders.workers)) * LOGGING_SHARE
    budget: float = cfg.time_budget  # type: ignore[assignment]
    left = budget - (time.perf_counter() - here.t_start) - budget_reserve(budget) - first_s
    left -= eval_s * objective.last_eval_extra  # --tta flip-last: the last evaluation's mirrored pass
    if cfg.init and objective.uses_labels:  # a fine-tune's evaluation before its first step ("before fine-tuning")
        left -= eval_s
    save_s = save_seconds(params=sum(p.numel() for p in net.parameters()),
                          trainable=sum(p.numel() for p in net.parameters() if p.requires_grad))  # fmt: skip
    total = steps_in_budget(left, per_step, eval_s + save_s, spe)
    epochs = max(1, math.ceil(total / spe))
    log(
        f"time budget {budget:.0f} s: {'the recipe probe measured' if reuse else 'measured'} "
        f"{per_step * 1000:.0f} ms per step"
        + (" on average over the resolution schedule" if r.res_schedule else "")
        + (
            f" with every token for {unmasked_phases(r)} of the steps, at "
            f"{full_over_dropped:.2f}x the time of a step that drops tokens"
            if unmasked
            else ""
        )
        + f" ({r.batch_size / per_step:.0f} img/s incl. augmentation), eval {eval_s:.1f} s, saving ~{save_s:.1f} s"
        + (f", decoding the first pass ~{first_s:.1f} s" if first_s else "")
        + f" -> {counted(total, 'step')}, {counted(epochs, 'epoch')}"
    )
    side = max(getattr(getattr(net, "config", None), "img_size", (0, 0)))  # (an objective's wrapper: no config)
    smaller = (side, PHOTO_SIZE) if cfg.init and not cfg.img_size and side > PHOTO_SIZE else None
    short = short_budget_line(budget=budget, left=left, per_step=per_step, eval_s=eval_s, save_s=save_s,
                              steps_per_epoch=spe, steps=total, n_eval=loaders.eval_size,
                              smaller_side=smaller)  # fmt: skip
    if short:
        log(short)
    return total, epochs, per_step, eval_s, save_s


def _probe(
    cfg: TrainConfig, r: Recipe, here: Here, *, net: nn.Module, run_net: nn.Module, loaders: Any, items: list,
    objective: Any, unmasked: bool,
) -> tuple[float, float, float, float]:  # fmt: skip
    """``(seconds per optimizer step, seconds of its update alone, cost of an unmasked step over a dropping one,
    seconds per evaluation)``, timed on a copy of the model (the compiled model itself with ``--compile``) with the
    run's optimizer (its kind and parameter groups, at LR 0)."""
    micro, device = loaders.micro, here.device
    probe = run_net if cfg.compile else copy.deepcopy(net)
    opt = here.optimizer(net if cfg.compile else probe, r, 0.0)  # the run's optimizer: Muon's step costs more
    images = [x for x, _ in items]
    xs = loaders.collate_train(images).to(device)  # a packed batch for --pack, its tokens dropped as the run's
    ys = torch.randint(0, max(1, loaders.num_classes), (micro,), device=device)
    probe.train()
    timed = {"objective": objective, "device": device, "amp_dtype": here.amp_dtype}
    step_s = time_steps(probe, opt, xs, ys, **timed) * r.accum_steps
    update_s = time_update(probe, opt, xs, ys, **timed)  # once per optimizer step, whatever the accumulation
    full_over_dropped = 1.0
    if unmasked:  # time the steps on every token too (and compile them, with --compile)
        set_patch_drop(probe, 0.0)  # the copy, or through the compiled wrapper the model itself
        if loaders.set_token_drop(0.0):  # --pack: the loader drops them
            xs = loaders.collate_train(images).to(device)
        full_over_dropped = time_steps(probe, opt, xs, ys, **timed) * r.accum_steps / step_s
        set_patch_drop(probe, r.token_drop)
        loaders.set_token_drop(r.token_drop)
    # Evaluation runs eager (no second compilation for its batch shape), with any adapters merged as the run's are.
    evaluator = net if cfg.compile else merge_adapters(probe)
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
    cfg: TrainConfig, recipe: Recipe, here: Here, *, net: nn.Module, run_net: nn.Module, loaders: Any,
    objective: Any, lr: float, log: Callable[[str], None], pace: Pace | None = None,
) -> tuple[RunPlan, Replanner]:  # fmt: skip
    """A new run's plan and its :class:`Replanner`: ``recipe``'s epochs, or as many steps as ``--time-budget``
    allows (:func:`measure_budget`; ``pace``: the recipe's probe, when there was one). The warmup is capped at half
    the run; every rank gets rank 0's plan."""
    spe = loaders.steps_per_epoch
    epochs, total, per_step, eval_s, save_s = recipe.epochs, recipe.epochs * spe, 0.0, 0.0, 0.0
    if cfg.time_budget:
        total, epochs, per_step, eval_s, save_s = measure_budget(
            cfg, recipe, here, net=net, run_net=run_net, loaders=loaders, objective=objective, log=log, pace=pace
        )
    warm, wanted = warmup_for(recipe, total_steps=total, steps_per_epoch=spe)
    if warm < wanted:
        log(f"note: warmup {wanted} steps capped at half the run ({warm} steps)")
    epochs, total, warm = broadcast_ints([epochs, total, warm], here.dist, here.device)
    plan = RunPlan(epochs=epochs, total_steps=total, steps_per_epoch=spe, warmup_steps=warm, lr=lr)
    replan = Replanner()
    if cfg.time_budget:  # due or not from the shared plan: its re-plan is a collective
        replan = Replanner.for_plan(
            total_steps=total,
            budget=cfg.time_budget,
            t_start=here.t_start,
            eval_s=eval_s,
            save_s=save_s,
            steps_per_epoch=spe,
            last_extra=objective.last_eval_extra,
            per_step=per_step,
            first_epoch_fills=loaders.first_epoch_fills,
            head_only=recipe.head_warmup,
        )
        if last := last_stretch_from(recipe):  # the first steps cost otherwise (smaller sizes, the warm start,
            replan.last_size_from = last  # token dropping): the plan is re-fitted once the last stretch has begun,
            replan.due = replan.late = (1 - last) * total >= 2 * REPLAN_AT  # and followed from there
    return plan, replan


@dataclass(kw_only=True)
class Replanner:
    """Keeps a time-budgeted run's plan on its budget. The planning probe times bare steps on a fixed batch; the
    run's own steps add data loading, clipping, the real optimizer and the machine's load of the moment. So a long
    run times its own steps ``REPLAN_FROM`` to ``REPLAN_AT`` of this process and re-fits the schedule to that pace
    once (with ``--res-schedule``, once its last size has begun: :attr:`last_size_from`).

    After that the pace is followed both ways, within a band: the steps and the end-of-epoch work since the last
    judgment make a stretch, judged at an epoch's end (and, in epochs of many steps, every :attr:`check_every` steps)
    once it holds :data:`STRETCH` steps and :data:`STRETCH_S` seconds (short epochs are taken together); the plan
    moves only when the stretch's pace is :data:`BAND` off the plan's, or the run would end :data:`BAND` of the time
    left early or later than the budget's reserve (:meth:`_judge`). Then the steps still to go are re-fitted to what
    that pace, the epoch ends still to come and the time left allow, shorter when the machine slowed, longer when it
    recovered. The time left is read from the clock, so time lost to a slow stretch is made up by the steps that
    follow, and the run ends on its budget. Each move re-fits the LR schedule from the current step without a jump
    (:meth:`~vitlab.train.engine.schedule.LRFactor.replan_from`).

    A replayed run (:meth:`replaying`) measures nothing: it makes the recorded moves at the recorded steps."""

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
    """Seconds of an evaluation, the probe's (what the last one's extra pass costs: :attr:`last_extra`)."""
    end_s: float = 0.0
    """Seconds of the work at an epoch's end, its evaluation and saving: first the probe's evaluation and the saving's
    estimate (:func:`~.pace.save_seconds`), then the mean of every epoch end the run has judged, as it timed them: in
    full (a tiny model's end takes a tenth of a second where the estimate may say half of one, and a plan that kept
    the estimate would stay short of its budget and move at every judgment), and over the whole run, not a stretch (the
    figures are redrawn every 30 s: a stretch with a redraw and one without would move the plan back and forth)."""
    ends: tuple[int, float] = (0, 0.0)
    """The epoch ends judged so far and their seconds (:attr:`end_s`'s mean)."""
    last_extra: float = 0.0
    """What the run's last evaluation costs beyond the others', in evaluations (``Objective.last_eval_extra``)."""
    steps_per_epoch: int = 1
    check_every: int = 0
    """Steps between the checks within an epoch (0: at epoch ends only)."""
    per_step: float = 0.0
    """The seconds a step the current plan was made at (0: unknown: every stretch is judged by its end alone)."""
    t0: float = 0.0
    mark: tuple[int, float] | None = None
    """``(step, clock)`` where the current stretch of steps began (after the early re-plan, each check and each
    epoch's end-of-epoch work)."""
    last_size_from: float = 0.0
    """The share of the plan where its last stretch of one step cost begins
    (:func:`~vitlab.train.conf.phases.last_stretch_from`: the last size of ``--res-schedule``, the warm start's or the
    token dropping's end; 0: every step costs the same). The steps before it do not tell the pace of the later ones, so
    the early re-plan times the steps ``REPLAN_FROM`` to ``REPLAN_AT`` of the last stretch, an epoch begun before them
    is not a pace, and no new plan is so long that a step would go back to an earlier stretch."""
    first_steps: int = 0
    """The steps at the run's start that are not its pace: the early re-plan times the steps after them, and an epoch
    begun among them is not judged. A first epoch that fills what the later ones read from memory (tar shards decoded,
    packed images resized: the loaders' ``first_epoch_fills``): on the clothing photos' shards its steps took 382 ms
    where the next ones took 227, and the early re-plan that timed both read 294 and cut the plan by 15%, then a later
    one lengthened it again. A fine-tune's head warmup (LP-FT, ``recipe.head_warmup``: only the head trains, and the
    backward pass stops there): on the clothing photos (23 such steps, 2 minutes, 2026-12-01) the early re-plan that
    timed steps 5 to 45 read 109-121 ms where the run's later steps took 137-158 (with RandAugment 145-175 against
    177-193), lengthened the plan by 17-36% and the next judgment cut it back."""
    followed_from: int = 0
    """The step of the early re-plan: epochs that began before it are not a pace (:meth:`after_epoch`)."""
    epoch_start: int = 0
    """The step at which the current epoch began."""
    stretch: list[float] = field(default_factory=lambda: [0, 0.0, 0, 0.0])
    """The stretch since the last judgment: ``[steps, their seconds, end-of-epoch works, their seconds]``."""
    paced: tuple[int, float] = (0, 0.0)
    """The judged steps since the machine's pace last changed and their seconds: the run's pace is their mean."""
    evidence: tuple[float, float] = (0.0, 0.0)
    """The evidence that the pace became slower, faster (the two sums of Page's CUSUM, :data:`EVIDENCE`)."""
    since: tuple[tuple[int, float], ...] = ()
    """The judged stretches (steps, seconds) since the evidence was last nil: where a change began."""
    recorded: tuple[Replan, ...] | None = None
    """A replay's moves (None: a measured run)."""

    @classmethod
    def for_plan(
        cls, *, total_steps: int, budget: float, t_start: float, eval_s: float, steps_per_epoch: int,
        save_s: float = 0.0, last_extra: float = 0.0, per_step: float = 0.0, first_epoch_fills: bool = False,
        head_only: int = 0,
    ):  # fmt: skip
        """A replanner for a fresh time-budgeted plan of ``total_steps`` (due only if the run is long enough) made at
        ``per_step`` seconds a step, ``eval_s`` and ``save_s`` at each epoch's end (``first_epoch_fills``, and
        ``head_only``, the steps of a head warmup: :attr:`first_steps`)."""
        first = max(steps_per_epoch if first_epoch_fills else 0, head_only)
        return cls(
            due=total_steps >= first + 2 * REPLAN_AT,
            first_steps=first,
            late=True,
            budget=budget,
            t_start=t_start,
            eval_s=eval_s,
            end_s=eval_s + save_s,
            last_extra=last_extra,
            steps_per_epoch=steps_per_epoch,
            per_step=per_step,
            check_every=max(REPLAN_AT - REPLAN_FROM, steps_per_epoch // 4) if steps_per_epoch >= 160 else 0,
        )

    @classmethod
    def replaying(cls, plan: RunPlan, *, done: int = 0) -> Replanner:
        """A replanner that makes ``plan``'s recorded moves after step ``done`` at their steps, measuring nothing."""
        return cls(recorded=tuple(m for m in plan.replans if m.step >= done))

    def _recorded(self, step: int, at: str) -> Replan | None:
        """The replay's move at ``step`` (``at`` its kind), if any; its epoch end becomes :attr:`end_s`, so that the
        move the run records is the recorded one."""
        move = next((m for m in self.recorded or () if m.step == step and m.at == at), None)
        if move is not None:
            self.end_s, self.per_step = move.end_s, move.per_step
        return move

    def after_step(
        self, *, steps_this_run: int, step: int, planned: int, dist: Dist, device: torch.device
    ) -> tuple[int, float] | None:
        """Called after every optimizer step: ``(new total steps, measured seconds per step)`` when the plan should
        change (the early re-plan by more than 2 %; a check within an epoch as :meth:`after_epoch`), else None."""
        if self.recorded is not None:
            move = self._recorded(step, "step")
            return None if move is None else (move.total, move.per_step)
        if self.due:
            since = step - math.ceil(self.last_size_from * planned) if self.last_size_from else steps_this_run
            since = min(since, step - self.first_steps)  # and after the filling epoch or the head warmup
            return self._early(since=since, step=step, planned=planned, dist=dist, device=device)
        if not (self.late and self.check_every and self.mark is not None and step < planned):
            return None
        if step - self.mark[0] < self.check_every:
            return None
        now = time.perf_counter()
        n, seconds = step - self.mark[0], now - self.mark[1]
        self.mark = (step, now)
        self.stretch[0] += n
        self.stretch[1] += seconds
        total = self._judge(step=step, planned=planned, now=now, dist=dist, device=device)
        return None if total is None else (total, self.per_step)

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
        self.mark, self.followed_from, self.per_step = (step, now), step, per_step
        left = self._left(now)
        total = self._capped(step, step + steps_in_budget(left, per_step, self.end_s, self.steps_per_epoch, step))
        (total,) = broadcast_ints([total], dist, device)
        self.due = False
        if abs(total - planned) <= 0.02 * planned:
            return None
        return total, per_step

    def after_epoch(
        self, *, step: int, planned: int, per_step: float, overhead_s: float, dist: Dist, device: torch.device
    ) -> int | None:
        """Called at each epoch's end, after its evaluation and saving (``overhead_s`` for them, ``per_step``
        seconds for each of its optimizer steps): the new total when the stretch since the last judgment, this
        epoch included, says the plan must move (:meth:`_judge`), else None. Not before the early re-plan, nor once
        the plan is done (its decay has ended: more steps would train at its last LR), nor on an epoch begun before
        the early re-plan of a run whose first steps cost otherwise."""
        if self.recorded is not None:
            move = self._recorded(step, "epoch")
            return None if move is None else move.total
        now = time.perf_counter()
        began, self.epoch_start = self.epoch_start, step
        if self.due:
            self.t0 += overhead_s  # the early re-plan times steps: an epoch end inside its window is not one
        if not self.late or self.due:
            return None
        since = max(0, step - max(began, self.mark[0] if self.mark is not None else began))
        self.mark = (step, now)
        if step >= planned or (self.last_size_from and began < self.followed_from) or began < self.first_steps:
            return None  # done, an epoch begun at a smaller size or before its last size was timed, or among the first
            # steps (the filling epoch, the head warmup)
        self.stretch[0] += since
        self.stretch[1] += since * per_step
        self.stretch[2] += 1
        self.stretch[3] += overhead_s
        return self._judge(step=step, planned=planned, now=now, dist=dist, device=device)

    def _run_pace(self, steps: int, seconds: float) -> float:
        """The run's pace once a stretch of ``steps`` in ``seconds`` is judged: the mean of every judged step since
        the machine's pace last changed. The stretch adds how far its log-pace is beyond :data:`CHANGE` off that mean
        (at most :data:`CHANGE` again) to the evidence that the pace became slower (or faster); once that evidence
        passes :data:`EVIDENCE`, the pace changed where the evidence began, and the mean restarts from the stretches
        since. One stretch's pace is the machine's noise as much as its speed: judged alone, it moved the plans of
        5-minute linear probes 16 and 19 times back and forth around a steady pace (docs/training.md)."""
        n, s = self.paced
        if n and s > 0 and seconds > 0:  # (a clock that did not move, in a test: no evidence)
            d = math.log(seconds / steps * n / s)
            slower = max(0.0, self.evidence[0] + min(d - CHANGE, CHANGE))
            faster = max(0.0, self.evidence[1] + min(-d - CHANGE, CHANGE))
            since = (*self.since, (steps, seconds))
            if max(slower, faster) > EVIDENCE:  # a change: the run's pace is that of the stretches that showed it
                self.paced = (sum(k for k, _ in since), sum(t for _, t in since))
                self.evidence, self.since = (0.0, 0.0), ()
                return self.paced[1] / self.paced[0]
            self.evidence, self.since = (slower, faster), since if slower or faster else ()
        self.paced = (n + steps, s + seconds)
        return self.paced[1] / self.paced[0]

    def _judge(self, *, step: int, planned: int, now: float, dist: Dist, device: torch.device) -> int | None:
        """The new total when the stretch since the last judgment holds :data:`STRETCH` steps and
        :data:`STRETCH_S` seconds and the run's pace (:meth:`_run_pace`, this stretch included) is :data:`BAND` off
        the plan's, or the plan would end :data:`BAND` of the time left early or later than the budget's reserve
        allows at that pace (and the move is beyond :data:`_TOLERANCE`); else None. A judged stretch ends there (the
        next one times what comes after it); a move makes the run's pace the plan's."""
        steps, seconds, works, work_s = self.stretch
        if steps < STRETCH or seconds + work_s < STRETCH_S:
            return None
        self.stretch = [0, 0.0, 0, 0.0]
        pace = self._run_pace(int(steps), seconds)
        if works:
            self.ends = (self.ends[0] + works, self.ends[1] + work_s)
            self.end_s = self.ends[1] / self.ends[0]
        left = self._left(now)
        evals = math.ceil(planned / self.steps_per_epoch) - step // self.steps_per_epoch
        ends_in = (planned - step) * pace + evals * self.end_s
        off_pace = self.per_step > 0 and abs(pace / self.per_step - 1) > BAND
        off_end = ends_in > left + budget_reserve(self.budget) or ends_in < (1 - BAND) * left
        (moves,) = broadcast_ints([int(off_pace or off_end)], dist, device)  # every rank decides as rank 0
        if not moves:
            return None
        total = self._new_total(step=step, planned=planned, per_step=pace, now=now, dist=dist, device=device)
        if total is not None:
            self.per_step = pace
        return total

    def _capped(self, step: int, total: int) -> int:
        """``total``, or with a last stretch at most the longest plan that keeps every step from ``step`` on in it
        (its start is a share of the plan: a longer one moves it later)."""
        return min(total, int(step / self.last_size_from)) if self.last_size_from else total

    def seconds_left(self) -> float | None:
        """Seconds of the time budget left now, its reserve included (None: no budget, or a run that follows a plan
        made before: a resumption or a replay)."""
        return self.budget - (time.perf_counter() - self.t_start) if self.budget else None

    def _left(self, now: float) -> float:
        """Seconds left for steps and evaluations at ``now``: the budget less the time spent, the reserve and the
        last evaluation's extra cost."""
        return self.budget - (now - self.t_start) - budget_reserve(self.budget) - self.eval_s * self.last_extra

    def _new_total(
        self, *, step: int, planned: int, per_step: float, now: float, dist: Dist, device: torch.device
    ) -> int | None:
        """The new total at ``per_step`` seconds a step from ``now`` on (rank 0's, on every rank), or None when it
        is within the tolerance of ``planned``."""
        left = self._left(now)
        more = 0 if left < per_step + self.end_s else steps_in_budget(left, per_step, self.end_s,
                                                                      self.steps_per_epoch, step)  # fmt: skip
        total, pace_us = broadcast_ints([self._capped(step, step + more), round(per_step * 1e6)], dist, device)
        pace = max(pace_us / 1e6, 1e-9)
        slack = max(_TOLERANCE * (planned - step), 0.01 * self.budget / pace)
        if total < planned and left < FINAL * self.budget:  # the end near: a late end beyond the reserve moves
            slack = min(slack, budget_reserve(self.budget) / pace)
        if abs(total - planned) <= slack:
            return None
        return total
