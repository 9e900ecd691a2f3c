"""HOW MUCH a run gets here, measured on this machine and this data, then chosen: the product's signature, *measure,
then choose*, in one room. Its product is one frozen result, :class:`Sizing`: the recipe fitted to the data and the
budget, how the data is stored for its side, the micro-batch and accumulation, the evaluation batch, the CPU threads
and DataLoader workers, the pace a probe measured, the plan of steps, and the lines the run prints about its choices.
:func:`choose` makes it before the model is built; :func:`plan` completes it after the loaders. The run's config is
never rewritten: it stays what the user asked for, the :class:`Sizing` holds what was chosen, and both are saved
(``last.pt``; ``config.yaml`` and ``sizing.json`` in the run folder), so that ``--resume`` and
``vitlab train --config runs/X/config.yaml`` read the choices back instead of making them again
(``--replan``: measure afresh).

The rules, no torch: :mod:`.recipe` (the auto recipe, the ``finetune`` recipe's batch, masked patch prediction's
patch and batch), :mod:`.finetune` (``vitlab finetune``'s auto recipe), :mod:`.levels` (augmentation and
regularisation, and what the end-of-run advice judges by), :mod:`.side` (THE side rule and a folder's storage, for
folders, shards and ``--pack`` alike), :mod:`.pace` (a time budget's arithmetic), :mod:`.capacity` (what ``vitlab
plan`` prints). The probes, torch: :mod:`.probe` (timed steps before anything is chosen), :mod:`.budget` (the plan, a
time budget's re-planning), :mod:`.memory` (the batch split to fit the free memory), :mod:`.machine` (free memory and
cores, threads and workers).

One direction: ``engine -> sizing -> conf``; the objectives do not import sizing: sizing looks its rules up by what a
run learns (:func:`~vitlab.train.conf.train_config.objective_name`). To add a sizing rule: write it torch-free in a rule
module, measure what it needs in a probe, and apply it in :func:`choose` or :func:`plan`, recording what it chose in
:class:`Sizing` (docs/training.md, "How a run is sized").

The names below are imported when first used (PEP 562): the rule modules import no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_names

if TYPE_CHECKING:
    from .choice import SIZING_FILE, Sizing, read_sizing
    from .probe import Here
    from .sizer import choose, plan, recipe_for
    from .steps import Replan, RunPlan

__all__ = ["SIZING_FILE", "Here", "Replan", "RunPlan", "Sizing", "choose", "plan", "read_sizing", "recipe_for"]

_WHERE = {
    "Here": "probe",
    "SIZING_FILE": "choice",
    "Sizing": "choice",
    "read_sizing": "choice",
    "choose": "sizer",
    "plan": "sizer",
    "recipe_for": "sizer",
    "Replan": "steps",
    "RunPlan": "steps",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
