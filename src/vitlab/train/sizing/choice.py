"""What a run chose (no torch): :class:`Sizing`, the room's one frozen result, and ``sizing.json``, how a run folder
keeps it beside its ``config.yaml`` and how it is read back as data (:func:`read_sizing`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._fs import NotAFile, TooLarge, read_small
from ...data.images.storage import FolderStorage
from ...models.config import ViTConfig
from ..conf.config_file import config_values
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig
from .pace import Pace
from .steps import RunPlan

__all__ = ["MAX_SIZING_BYTES", "SIZING_FILE", "Sizing", "read_sizing"]


SIZING_FILE = "sizing.json"
"""What a run chose, beside its ``config.yaml`` (what it was asked): :meth:`Sizing.record`."""
MAX_SIZING_BYTES = 1 << 20
"""The largest ``sizing.json`` read (a run's is about 3 KiB)."""


@dataclass(frozen=True, kw_only=True)
class Sizing:
    """What a run gets here (see the module's notes). ``recipe``: what it trains with (the config's recipe fitted to
    the data and the budget, its batch split for the memory); ``chosen``: the line that says how the recipe was fitted
    (None: as asked); ``storage``: how the data is stored for the side chosen
    (:class:`~vitlab.data.images.storage.FolderStorage`; None: a built-in data set); ``micro``: images a forward pass on
    each process; ``eval_batch``; ``threads`` and ``workers``; ``pace``: what the recipe's probe measured (None: no
    probe); ``plan``: the steps planned at the start (None until :func:`plan`); ``lines``: what the run prints about its
    choices; ``replayed``: where the choices were read from (None: measured here). ``model`` is the architecture chosen
    (not saved: it follows from the recipe)."""

    recipe: Recipe
    chosen: str | None = None
    storage: FolderStorage | None = None
    micro: int = 1
    eval_batch: int = 1
    threads: int = 1
    workers: int = 0
    pace: Pace | None = None
    plan: RunPlan | None = None
    lines: tuple[str, ...] = ()
    replayed: str | None = None
    model: ViTConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (``last.pt`` and ``sizing.json`` keep them), for :meth:`from_dict`."""
        return {
            "recipe": self.recipe.to_dict(),
            "chosen": self.chosen,
            "storage": self.storage.record() if self.storage is not None else None,
            "micro": self.micro,
            "eval_batch": self.eval_batch,
            "threads": self.threads,
            "workers": self.workers,
            "pace": dataclasses.asdict(self.pace) if self.pace is not None else None,
            "plan": self.plan.to_dict() if self.plan is not None else None,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Sizing:
        """The sizing a :meth:`to_dict` describes. Read from a file as data: every value is checked (the recipe as
        a recipe is, the storage and plan by their own readers); a ``ValueError`` names what is wrong."""
        if not isinstance(d, dict) or not {"recipe", "micro", "eval_batch", "threads", "workers"} <= set(d):
            raise ValueError("not a vitlab sizing (recipe, micro, eval_batch, threads, workers)")
        for key in ("micro", "eval_batch", "threads", "workers"):
            v = d[key]
            if type(v) is not int or not (0 if key == "workers" else 1) <= v <= 1 << 20:
                raise ValueError(f"{key}: {v!r} is not a count")
        chosen = d.get("chosen")
        if chosen is not None and (not isinstance(chosen, str) or len(chosen) > 10_000):
            raise ValueError("chosen: not a line of text")
        storage = None
        if d.get("storage") is not None:
            storage = FolderStorage.from_record(d["storage"])
            if storage is None:
                raise ValueError("storage: not a folder's storage")
        try:
            recipe = Recipe.from_dict(d["recipe"])
            recipe.validate()
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"recipe: {e}") from None
        pace = _pace(d.get("pace"))
        plan = RunPlan.from_dict(d["plan"]) if d.get("plan") is not None else None
        return cls(recipe=recipe, chosen=chosen, storage=storage, micro=d["micro"], eval_batch=d["eval_batch"],
                   threads=d["threads"], workers=d["workers"], pace=pace, plan=plan)  # fmt: skip

    def record(self, cfg: TrainConfig, *, plan: RunPlan, fingerprint: dict[str, Any] | None) -> dict[str, Any]:
        """``sizing.json``: this sizing (its plan as planned at the start), the re-plans the run made since
        (``plan``: the run's plan now), what the run was asked (as its ``config.yaml`` holds it,
        :func:`~vitlab.train.conf.config_file.config_values`) and the data's fingerprint: what a replay
        (:func:`read_sizing`) checks before it reads the choices back."""
        return {
            "vitlab_sizing": 1,
            "sizing": self.to_dict(),
            "replans": [m.to_dict() for m in plan.replans],
            "config": config_values(cfg),
            "data_fingerprint": fingerprint,
        }


def _pace(d: Any) -> Pace | None:
    """A saved :class:`~.pace.Pace` (None when there is none), every number checked."""
    if d is None:
        return None
    names = {f.name for f in dataclasses.fields(Pace)}
    if not isinstance(d, dict) or not set(d) <= names:
        raise ValueError("pace: not a measured pace")
    numbers = ("step_s", "step_macs", "eval_s", "eval_image_macs", "elapsed_s", "read_s", "first_pass_s", "teacher_s")
    if any(type(d.get(k, 0.0)) not in (int, float) or not 0 <= d.get(k, 0.0) < 1e30 for k in numbers):
        raise ValueError("pace: a time or a count out of range")
    aug = d.get("aug_s", {})
    if not isinstance(aug, dict) or any(type(v) not in (int, float) for v in aug.values()):
        raise ValueError("pace: aug_s")
    return Pace(**{k: v for k, v in d.items() if k in names})


def read_sizing(folder: Path) -> dict[str, Any] | None:
    """``folder/sizing.json`` (what a run chose, :meth:`Sizing.record`) read as data: None when there is none; a
    regular file of at most :data:`MAX_SIZING_BYTES`, JSON, every value checked (``ValueError`` otherwise). The
    result holds the :class:`Sizing` (``"sizing"``, its plan the initial one), the re-plans
    (:class:`~.budget.Replan`), the config and the data fingerprint."""
    path = Path(folder) / SIZING_FILE
    if not path.is_file() or path.is_symlink():
        return None
    try:
        doc = json.loads(read_small(path, limit=MAX_SIZING_BYTES, links=False).decode("utf-8"))
    except TooLarge:
        raise ValueError(f"{path}: larger than a sizing.json ({MAX_SIZING_BYTES:,} bytes)") from None
    except NotAFile:
        return None
    if not isinstance(doc, dict) or doc.get("vitlab_sizing") != 1:
        raise ValueError(f"{path}: not a vitlab sizing.json")
    sizing = Sizing.from_dict(doc.get("sizing"))
    replans = RunPlan.from_dict({**(doc["sizing"].get("plan") or {}), "replans": doc.get("replans", [])}).replans
    config = doc.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{path}: config is not a mapping")
    return {"sizing": sizing, "replans": replans, "config": config, "fingerprint": doc.get("data_fingerprint")}
