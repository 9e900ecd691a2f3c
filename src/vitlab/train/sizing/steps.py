"""The run's plan (no torch): :class:`RunPlan`, its epochs and optimizer steps, and the moves a time budget made of
it since (:class:`Replan`), as plain numbers that ``last.pt`` and ``sizing.json`` keep, each read back with every
value checked. :mod:`.budget` makes and moves it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Replan", "RunPlan"]


@dataclass(frozen=True, kw_only=True)
class Replan:
    """One move of a running plan: after optimizer step ``step`` (``at`` ``"step"``: right after it; ``"epoch"``: at
    its epoch's end, after the evaluation) the plan ends at ``total``; ``per_step``: the seconds a step it was made
    from (the run's pace: :meth:`~.budget.Replanner._run_pace`), ``end_s`` the seconds of an epoch's end (its
    evaluation and saving; 0: not recorded). A replay makes the same moves at the same points
    (:meth:`Replanner.replaying`)."""

    step: int
    total: int
    at: str = "epoch"
    per_step: float = 0.0
    end_s: float = 0.0

    def line(self, *, was: int, warmup: int, replayed: bool) -> str:
        """The run's line for this move: what it was made from (a replay says so), the new and the old total."""
        which = "the run's steps since its pace last changed take" if self.at == "epoch" else "the run's own steps take"
        how = "replayed" if replayed else f"{which} {self.per_step * 1000:.0f} ms"
        if self.end_s and self.at == "epoch" and not replayed:  # timed by the run at its epochs' ends
            how += f" and an epoch's end (evaluation, saving) {self.end_s:.2f} s"
        return f"time budget: {how} -> re-planned to {self.total} steps (was {was}), warmup {warmup} steps"

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "total": self.total, "at": self.at, "per_step": self.per_step, "end_s": self.end_s}

    @classmethod
    def from_dict(cls, d: Any) -> Replan:
        """The move a :meth:`to_dict` describes (read from a file: every value checked, a ``ValueError`` otherwise)."""
        keys = {"step", "total", "at", "per_step"}
        if not isinstance(d, dict) or set(d) not in (keys, keys | {"end_s"}):  # end_s: absent before it was kept
            raise ValueError("a re-plan is {step, total, at, per_step, end_s}")
        step, total, at, pace, end = d["step"], d["total"], d["at"], d["per_step"], d.get("end_s", 0.0)
        if not (_count(step) and _count(total) and at in ("step", "epoch") and _seconds(pace) and _seconds(end)):
            raise ValueError(f"a re-plan's values are out of range: {d!r}")
        return cls(step=step, total=total, at=at, per_step=float(pace), end_s=float(end))


def _count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= 1 << 40


def _seconds(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and 0 <= v <= 1e9


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """The run's length: ``epochs`` of ``steps_per_epoch`` optimizer steps, ``total_steps`` planned (the LR schedule
    ends there), ``warmup_steps`` of them warming up, at the peak ``lr`` (the recipe's, scaled to the batch); the
    recipe's epochs, or as many steps as ``--time-budget`` allows. ``replans``: the moves a time budget made since
    (each gives a new plan, :meth:`replanned`). Saved in ``last.pt`` and ``sizing.json`` as plain numbers."""

    epochs: int
    total_steps: int
    steps_per_epoch: int
    warmup_steps: int | None = None
    """The LR warmup's steps (None: a ``last.pt`` from before they were saved: the schedule's own)."""
    lr: float = 0.0
    replans: tuple[Replan, ...] = ()

    def replanned(self, move: Replan, *, warmup_steps: int) -> RunPlan:
        """The plan after ``move`` (its warmup re-fitted to ``warmup_steps``)."""
        return replace(
            self,
            total_steps=move.total,
            warmup_steps=warmup_steps,
            epochs=max(1, math.ceil(move.total / self.steps_per_epoch)),
            replans=(*self.replans, move),
        )

    def done(self, *, step: int, epoch: int) -> bool:
        """Whether a run at optimizer step ``step``, ``epoch`` epochs finished, has nothing left of this plan."""
        return step >= self.total_steps or epoch >= self.epochs

    def with_epochs(self, epochs: int) -> RunPlan:
        """The plan re-planned to ``epochs`` (``--resume --epochs``): the LR schedule then ends there."""
        return replace(self, epochs=epochs, total_steps=epochs * self.steps_per_epoch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "total_steps": self.total_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "warmup_steps": self.warmup_steps,
            "lr": self.lr,
            "replans": [m.to_dict() for m in self.replans],
        }

    @classmethod
    def from_dict(cls, d: Any) -> RunPlan:
        """The plan a :meth:`to_dict` describes (a ``last.pt`` from before re-plans were kept has none); read from a
        file: every value is checked, a ``ValueError`` otherwise."""
        if not isinstance(d, dict):
            raise ValueError("a plan is a mapping")
        epochs, total, spe, warm, lr = (d.get(k) for k in ("epochs", "total_steps", "steps_per_epoch",
                                                           "warmup_steps", "lr"))  # fmt: skip
        if not (_count(epochs) and _count(total) and _count(spe) and spe >= 1 and (warm is None or _count(warm))):
            raise ValueError(f"a plan's counts are out of range: {d!r}")
        lr = 0.0 if lr is None else lr
        if not _seconds(lr):
            raise ValueError(f"a plan's lr is not a finite number: {lr!r}")
        moves = d.get("replans", [])
        if not isinstance(moves, list) or len(moves) > 100_000:
            raise ValueError("a plan's re-plans are a list")
        return cls(epochs=epochs, total_steps=total, steps_per_epoch=spe, warmup_steps=warm, lr=float(lr),
                   replans=tuple(Replan.from_dict(m) for m in moves))  # fmt: skip
