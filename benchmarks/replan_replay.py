"""How often a ``--time-budget`` run moves its plan, and where it ends, replayed: the paces finished runs recorded
(each epoch's steps, its training seconds and the seconds of its end, from ``metrics.jsonl``), or generated ones
(``--synthetic``: a steady pace with noise, a machine that halves or doubles its speed part-way), are fed to the
re-planner with a clock of their own, epoch by epoch, as the trainer feeds it (docs/training.md, "Re-planning within
a band"). Nothing is trained or timed: the re-planner of the checkout the script imports decides, so two checkouts
compare on the same paces (``PYTHONPATH=OTHER/src python benchmarks/replan_replay.py ...``).

    python benchmarks/replan_replay.py runs/ftd/seed0-5m/finetune runs/ftd/seed0-5m/probe   # recorded runs
    python benchmarks/replan_replay.py --synthetic --seeds 5                                # generated paces

A recorded run is replayed from its start with the plan it made first (``sizing.json``); each epoch's measured pace
stands for the machine at that point of the run, so a replay that plans more epochs than the run made repeats the
last one. Its replayed moves are close to, not equal to, the run's own (the steps inside an epoch are taken at its
mean; the probes before the first step are the run's recorded wall time)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from _common import Replanner, read_metrics, sizing_budget

from vitlab.distributed import Dist

MAX_JSON = 1 << 22
"""The most bytes read of a run's ``sizing.json``."""
KINDS = ("steady", "slower at 40%", "faster at 40%", "slower at 85%", "slower from 30 to 60%")
"""The generated machines: a steady pace; half the speed (or twice it) from 40% of the budget on; half the speed in
its last 15%; 1.6x slower from 30% to 60% of it, then back."""
MACHINES = ((60.0, 0.06, 2, 0.08), (120.0, 0.06, 12, 0.1), (600.0, 0.15, 23, 0.5), (1800.0, 0.3, 100, 1.0))
"""Generated runs: ``(budget s, seconds a step, steps an epoch, seconds of an epoch's end)``: a 1-minute run of 24
photos, a 2-minute one of a small folder, a 10-minute fine-tune of the clothing photos (the tiny model, batch 128) and
a half-hour run of larger epochs."""


@dataclass
class Trace:
    """A run's epochs as the re-planner sees them: ``epochs`` of ``(steps, seconds a step, seconds of its end)``."""

    name: str
    budget: float
    total: int
    steps_per_epoch: int
    eval_s: float
    start: float
    epochs: list[tuple[int, float, float]]
    recorded: int | None = None
    """The moves the run itself made (None: generated paces)."""
    steps: int | None = None
    """The steps the run itself made."""


def recorded(run: Path) -> Trace:
    """A finished time-budgeted run's epochs, from its ``metrics.jsonl`` and ``sizing.json``."""
    sizing_file = run / "sizing.json"
    if not sizing_file.is_file() or sizing_file.stat().st_size > MAX_JSON:
        raise SystemExit(f"{run}: no sizing.json of a finished run")
    s = json.loads(sizing_file.read_text(encoding="utf-8"))
    budget = (s.get("config") or {}).get("time_budget")
    if not budget:
        raise SystemExit(f"{run}: not a --time-budget run")
    plan, batch = s["sizing"]["plan"], s["sizing"]["recipe"]["batch_size"]
    rows = read_metrics(run / "metrics.jsonl")
    epochs, step, wall = [], 0, None
    for r in rows:
        n = r["step"] - step
        train_s = n * batch / r["images_per_sec"]
        end_s = math.nan if wall is None else max(0.0, r["wall_s"] - wall - train_s)
        epochs.append((n, train_s / n, end_s))
        step, wall = r["step"], r["wall_s"]
    ends = sorted(e[2] for e in epochs[1:]) or [0.0]
    first = (epochs[0][0], epochs[0][1], ends[len(ends) // 2])  # the first epoch's end: the run's median
    epochs[0] = first
    start = rows[0]["wall_s"] - first[0] * first[1] - first[2]  # the probes and setup before the first step
    return Trace(name=f"{run.parent.name}/{run.name}", budget=float(budget), total=plan["total_steps"],
                 steps_per_epoch=plan["steps_per_epoch"], eval_s=(s["sizing"].get("pace") or {}).get("eval_s", 0.0),
                 start=start,
                 epochs=epochs, recorded=len(s["replans"]), steps=step)  # fmt: skip


def generated(kind: str, *, seed: int, budget: float, per_step: float, spe: int, end_s: float) -> Trace:
    """A run of steady ``per_step`` seconds a step on the machine ``kind`` (:data:`KINDS`), each epoch's pace drawn
    from 0.8x to 1.25x of it (the 2-core machine's swings, epoch to epoch)."""
    rng = np.random.default_rng(seed)
    epochs, t = [], 0.0
    while t < 1.5 * budget:
        at = t / budget
        f = {KINDS[1]: 2.0 if at > 0.4 else 1.0, KINDS[2]: 0.5 if at > 0.4 else 1.0,
             KINDS[3]: 2.0 if at > 0.85 else 1.0, KINDS[4]: 1.6 if 0.3 < at < 0.6 else 1.0}.get(kind, 1.0)  # fmt: skip
        pace = per_step * f * rng.uniform(0.8, 1.25)
        epochs.append((spe, pace, end_s))
        t += spe * pace + end_s
    return Trace(name=f"{kind}, seed {seed}", budget=budget, total=int(budget / per_step), steps_per_epoch=spe,
                 eval_s=0.8 * end_s, start=0.05 * budget, epochs=epochs)  # fmt: skip


@contextlib.contextmanager
def replay_clock(start: float) -> Iterator[list[float]]:
    """The re-planner's clock while a replay runs: ``[seconds]``, which the replay advances (the module's own
    ``time``, so that any checkout's re-planner reads it)."""
    now, kept = [start], sizing_budget.time
    sizing_budget.time = SimpleNamespace(perf_counter=lambda: now[0])
    try:
        yield now
    finally:
        sizing_budget.time = kept


def replay(trace: Trace) -> dict[str, Any]:
    """The moves, steps and end of ``trace`` replayed through the re-planner (its early re-plan included)."""
    with replay_clock(trace.start) as now:
        return _replay(trace, now)


def _replay(trace: Trace, now: list[float]) -> dict[str, Any]:
    r = Replanner.for_plan(total_steps=trace.total, budget=trace.budget, t_start=0.0, eval_s=trace.eval_s,
                           save_s=0.05, steps_per_epoch=trace.steps_per_epoch)  # fmt: skip
    kw = {"dist": Dist(), "device": torch.device("cpu")}
    planned, step, moves, i = trace.total, 0, 0, 0
    while step < planned:
        _, per_step, end_s = trace.epochs[min(i, len(trace.epochs) - 1)]
        i += 1
        for _ in range(trace.steps_per_epoch):
            if step >= planned:
                break
            step += 1
            now[0] += per_step
            if got := r.after_step(steps_this_run=step, step=step, planned=planned, **kw):
                moves, planned = moves + 1, got[0]
        now[0] += end_s
        if got := r.after_epoch(step=step, planned=planned, per_step=per_step, overhead_s=end_s, **kw):
            moves, planned = moves + 1, got
    return {"moves": moves, "steps": step, "end_s": now[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="finished --time-budget run folders")
    p.add_argument("--synthetic", action="store_true", help="generated paces (KINDS x MACHINES) instead")
    p.add_argument("--seeds", type=int, default=5, help="generated runs per machine and kind (default 5)")
    a = p.parse_args()
    if a.synthetic:
        print("| budget | machine | moves (most) | end, s (least - most) |\n|---|---|---|---|")
        for budget, per_step, spe, end_s in MACHINES:
            for kind in KINDS:
                got = [replay(generated(kind, seed=s, budget=budget, per_step=per_step, spe=spe, end_s=end_s))
                       for s in range(a.seeds)]  # fmt: skip
                ends = [g["end_s"] for g in got]
                print(f"| {budget:.0f} s | {kind} | {max(g['moves'] for g in got)} | "
                      f"{min(ends):.1f} - {max(ends):.1f} |")  # fmt: skip
        return
    if not a.runs:
        p.error("give run folders, or --synthetic")
    print("| run | budget | moves: the run's | replayed | steps: the run's | replayed | replay ends at |")
    print("|---|---|---|---|---|---|---|")
    for run in a.runs:
        t = recorded(run)
        got = replay(t)
        print(f"| {t.name} | {t.budget:.0f} s | {t.recorded} | {got['moves']} | {t.steps} | {got['steps']} | "
              f"{got['end_s']:.1f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
