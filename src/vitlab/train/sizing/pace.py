"""The arithmetic of a ``--time-budget`` (no torch): how many optimizer steps fit in the seconds left
(:func:`steps_in_budget`), what a measured probe says a step of another model or augmentation level costs
(:class:`Pace`), and the line that says when a budget cannot buy a meaningful run (:func:`short_budget_line`).

The auto recipe (:mod:`vitlab.train.sizing.recipe`) chooses its augmentation level, batch and model from a
:class:`Pace` measured on the run's own data before anything is chosen (:mod:`vitlab.train.sizing.probe`), and
the run's plan (:mod:`vitlab.train.sizing.budget`) counts steps with the same :func:`steps_in_budget`, so that the
passes the auto line states are the passes the run plans."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "FEWEST_EVAL_IMAGES",
    "LOGGING_SHARE",
    "STEP_FORWARDS",
    "Pace",
    "budget_reserve",
    "save_seconds",
    "short_budget_line",
    "step_forwards",
    "steps_in_budget",
    "train_step_macs",
]

LOGGING_SHARE = 1.03
"""A training step in the run costs about 3% more than the same step in a probe (logging, the progress bar)."""
SAVE_BYTES_PER_S = 200e6
"""How fast an epoch's end writes the run's state (``last.pt``: ``torch.save``, then fsync): 144 to 299 MB/s on the
2-core machine for 7 MB to 1 GB of it, the small files slowest (``benchmarks/bench_checkpoint_save.py``,
docs/training.md "Re-planning within a band")."""
SAVE_FIXED_S = 0.02
"""Seconds of an epoch's end beyond its evaluation and the state's bytes (its metrics row and line, the random
generators' states, the folder's fsync): a head-only fine-tune of the tiny model (a 2.2-MB ``last.pt``, about
0.015 s of it) timed its whole epoch ends, 3 images evaluated, at 0.04 s (docs/training.md)."""


STEP_FORWARDS = {"full": 3.0, "lora": 2.8, "ssf": 2.6, "bias": 2.2, "head": 1.0}
"""A training step's cost in forward passes, by what trains (every value of a recipe's ``tuning``). Every weight: 3,
the backward pass computing the activations' gradients and the weights', each about a forward's. The others are 3 x
the median of their measured step time against a full step's (docs/performance.md, "Parameter-efficient fine-tuning
on the CPU": ViT-Ti/16, S/16, B/16 at 224 px and the auto recipe's smallest model at 64 px, on two machines): LoRA
0.82-1.10x (r 4 and 8; its thin products and the frozen weight's fused node cost about what the weight gradients
save), SSF 0.84-0.98x, the biases 0.71-0.89x, the head alone 0.33-0.39x (no gradient flows into the frozen body).
Every estimate of a step's work (the auto recipe's model and passes, the fine-tune's, the threads, the expected wall
time) counts with this table (:func:`train_step_macs`). (It held 2 for every adapter, a LoRA step estimated at 0.67x
a full one: a fine-tune's first line said ~171 steps of 125 ms where the run then measured 218 ms.)"""


def step_forwards(tuning: str = "full") -> float:
    """A training step's cost in forward passes when what ``tuning`` names trains (:data:`STEP_FORWARDS`)."""
    return STEP_FORWARDS[tuning]


def train_step_macs(forward_macs: float, batch: int, *, tuning: str = "full") -> float:
    """Multiply-accumulates of one optimizer step of ``batch`` images whose forward costs ``forward_macs`` each,
    training what ``tuning`` names (:func:`step_forwards`)."""
    return step_forwards(tuning) * forward_macs * batch


def save_seconds(*, params: int, trainable: int) -> float:
    """The first estimate of the saving at an epoch's end, before the run has timed one: ``last.pt``'s weights (4
    bytes each) and the optimizer's two moments of each trainable weight (8 bytes, AdamW's) at
    :data:`SAVE_BYTES_PER_S`, plus :data:`SAVE_FIXED_S`. From 0.05 s for the auto recipe's tiny model to 5 s for
    ViT-B/16; the run's own epoch ends replace it (:class:`~vitlab.train.sizing.budget.Replanner`)."""
    return SAVE_FIXED_S + (4 * params + 8 * trainable) / SAVE_BYTES_PER_S


def budget_reserve(budget: float) -> float:
    """Seconds kept back from a time budget for the final save and figures."""
    return min(5.0, 0.1 * budget)


def steps_in_budget(left: float, per_step: float, end_s: float, steps_per_epoch: int, done: int = 0) -> int:
    """How many more optimizer steps fit in ``left`` seconds after ``done`` steps: ``per_step`` each, plus the work
    at the end of every epoch they finish or start (``end_s``: its evaluation and saving).

    The answer is the largest ``n`` from 1 to ``left / per_step`` whose cost fits (1 when none does). The cost
    grows with ``n`` (in floating point too: rounding is monotonic), so a bisection finds it in O(log n) steps:
    a budget of years plans as fast as one of minutes."""

    def cost(n: int) -> float:
        return n * per_step + (math.ceil((done + n) / steps_per_epoch) - done // steps_per_epoch) * end_s

    lo, hi = 1, max(1, int(left / per_step))  # cost(lo) fits, or lo is the answer anyway; the answer is <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) > left:
            hi = mid - 1
        else:
            lo = mid
    return lo


@dataclass(frozen=True, kw_only=True)
class Pace:
    """What a probe measured on the run's own data, in this process, before the recipe is chosen: a few training
    steps of one model (the smallest the auto recipe would pick), each augmentation level's transform on real
    training items, and an evaluation pass. Other models' steps are scaled from the probed one by their
    multiply-accumulates (:meth:`step_s`), so one probe serves every candidate."""

    step_s: float
    """Seconds of one optimizer step of the probed model on ``batch`` images (forward, backward, AdamW)."""
    step_macs: float
    """Multiply-accumulates of that step (3 x the forward's, with the token dropping it trains with)."""
    batch: int
    aug_s: dict[str, float] = field(default_factory=dict)
    """Seconds per image of each augmentation level's training transform (a :data:`~.levels.LEVELS` key)."""
    workers: int = 0
    """DataLoader workers of the run: with any, augmentation runs beside the steps, else before each one."""
    eval_s: float = 0.0
    """Seconds of one evaluation of the whole evaluation split with the probed model."""
    eval_image_macs: float = 1.0
    """Forward multiply-accumulates of the probed model on one evaluation image (every token)."""
    n_eval: int = 0
    """Images of the evaluation split."""
    elapsed_s: float = 0.0
    """Seconds of the run spent when the probe ended (the budget's part already used)."""
    read_s: float = 0.0
    """Seconds a training image's reading costs at every pass, part of :attr:`aug_s` (tar shards: the sample read
    from its shard; 0: a folder's images, in memory)."""
    first_pass_s: float = 0.0
    """Seconds the run's first pass over its images costs once, beyond its steps and evaluations: tar shards'
    samples decoded as they are first read and kept in memory after (the training split's without DataLoader
    workers, the evaluation batches always, up to :data:`~vitlab.data.shards.stream.KEEP_BYTES`), so charged once,
    not at every step (0: a folder, decoded before the probe)."""
    probe: str = ""
    """What was probed, for the auto recipe's line (e.g. ``"model tiny, 32 images"``)."""
    arch: dict = field(default_factory=dict)
    """The probed model's fields, so that the run's own probe can reuse :attr:`step_s` for the same model."""
    teacher_s: float = 0.0
    """Seconds a training image costs a distillation teacher's forward (frozen, at its own input size), added to
    every candidate's step: it does not shrink with the student (0: no teacher)."""

    def per_step(self, *, level: str, step_macs: float, batch: int) -> float:
        """Seconds of one optimizer step of ``batch`` images costing ``step_macs`` at augmentation ``level``, as the
        run will take it: the compute scaled from the probe (a teacher's forward added, :attr:`teacher_s`), and the
        augmentation added (no workers) or beside it (workers: whichever of the two is slower sets the pace)."""
        compute = self.step_s * step_macs / self.step_macs + batch * self.teacher_s
        aug = batch * self.aug_s.get(level, 0.0)
        return (compute + aug if self.workers == 0 else max(compute, aug / self.workers)) * LOGGING_SHARE

    def budget_left(self, budget: float) -> float:
        """Seconds of a ``budget`` left for the run's steps and epoch ends once the probe has ended: less what it
        spent (:attr:`elapsed_s`), the reserve for the final save (:func:`budget_reserve`) and the first pass's
        decoding (:attr:`first_pass_s`)."""
        return budget - self.elapsed_s - budget_reserve(budget) - self.first_pass_s

    def evaluation_s(self, image_macs: float) -> float:
        """Seconds of one evaluation of the split with a model of ``image_macs`` forward multiply-accumulates an
        image."""
        return self.eval_s * image_macs / self.eval_image_macs


FEWEST_EVAL_IMAGES = 50
"""The smallest evaluation split the short-budget warning proposes: the top-1 of fewer images is noise (one standard
error of up to 7 points at 50), not a measurement worth an epoch's end."""


def short_budget_line(
    *, budget: float, left: float, per_step: float, eval_s: float, save_s: float, steps_per_epoch: int, steps: int,
    n_eval: int, smaller_side: tuple[int, int] | None = None,
) -> str | None:  # fmt: skip
    """One line when ``steps`` planned in a ``budget`` of seconds (``left`` of them for training and the epochs'
    ends) cannot make a meaningful run, else None: fewer than one pass over the data, or the epochs' ends (an
    evaluation of ``eval_s`` and a saving of ``save_s`` each) taking more than half of the time. It proposes the
    budget that buys three epochs with their ends in at most half of it (whole minutes) when that is a longer budget,
    with the passes that budget's plan would count at this pace (whole minutes buy more than three: a 30-s run of
    masked patch prediction was told "2m buys about 3 epochs", and a 2-minute one made 4.5),
    and, when evaluation dominates, an evaluation split small enough to take a quarter of an epoch's time (not one of
    fewer than :data:`FEWEST_EVAL_IMAGES`). ``smaller_side``: ``(the run's side, a smaller one it could take)``, for
    a fine-tune at its ``--init`` model's side (DINOv2's 518 px) where the usual 224 px is a choice: proposed with
    the share of tokens it saves. It says only what the plan it was made from does: a run of many short epochs is
    not told that its budget "buys only" them."""
    passes = steps / steps_per_epoch
    end_s = eval_s + save_s
    ends = math.ceil(passes) * end_s
    if passes >= 1 and ends <= 0.5 * left:
        return None
    spent = budget - left - budget_reserve(budget)
    run = max(3 * (steps_per_epoch * per_step + end_s), 6 * end_s)  # 3 epochs, their ends at most half of the time
    need = spent + run + budget_reserve(spent + run)
    minutes = max(1, math.ceil(need / 60))
    timing = (
        f"({eval_s:.1f} s of evaluation and {save_s:.1f} s of saving each, {steps_per_epoch} steps an epoch at "
        f"{per_step * 1000:.0f} ms)"
    )
    what = f"evaluating and saving take {ends:.0f} s of the {max(0.0, left):.0f} s left"
    if passes < 1:
        line = (
            f"warning: --time-budget {_duration(budget)} buys only {passes:.2f} passes over the training data, and "
            f"{what} {timing}"
        )
    else:
        line = f"warning: {what}: {math.ceil(passes)} epoch ends in {passes:.1f} passes {timing}"
    more = minutes * 60 > budget
    if more:  # what that budget's plan would count at this pace (not the 3 asked: whole minutes buy more)
        at = minutes * 60.0
        n = steps_in_budget(at - spent - budget_reserve(at), per_step, end_s, steps_per_epoch)
        line += f": --time-budget {minutes}m buys about {n / steps_per_epoch:.1f} passes"
    if ends > 0.5 * left and eval_s > save_s:
        keep = max(1, int(n_eval * 0.25 * steps_per_epoch * per_step / eval_s))
        if FEWEST_EVAL_IMAGES <= keep < n_eval:
            line += (", or" if more else ":") + f" evaluate on fewer images (an evaluation folder of ~{keep:,} of the "
            line += f"{n_eval:,})"
            more = True
    if smaller_side is not None:
        side, to = smaller_side
        line += (", or" if more else ":") + f" fine-tune at --img-size {to} (about {(side / to) ** 2:.0f}x fewer "
        line += f"tokens a step than at {side} px; its position table resampled, Sec. 3.2)"
    return line


def _duration(seconds: float) -> str:
    """``120`` -> ``2m``, ``90`` -> ``90s``: how a user would write the budget."""
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"
