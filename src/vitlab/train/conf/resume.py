"""What ``--resume`` may change: a resumed run is the same run, only how it is driven may change. The rules are
the option table's (:attr:`~vitlab.train.conf.options.Option.resume`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from . import arch
from .options import OPTIONS, flag_for, path_of, pipe_trusted
from .recipes import Recipe
from .train_config import TrainConfig

__all__ = ["resumed_config", "trained_recipe"]


def trained_recipe(state: dict[str, Any]) -> Recipe:
    """The recipe the run saved in ``state`` (a read ``last.pt``) trains with: its sizing's
    (:class:`~vitlab.train.sizing.Sizing`), or, in a ``last.pt`` from before the sizing room, its configuration's
    (which then held the fitted recipe)."""
    sizing = state.get("sizing")
    if isinstance(sizing, str):
        return Recipe.from_dict(json.loads(sizing)["recipe"])
    return Recipe.from_dict(json.loads(state["config"])["recipe"])


def resumed_config(
    state: dict[str, Any],
    given: TrainConfig,
    *,
    flags: Collection[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainConfig:
    """The configuration saved in the checkpoint ``state`` with what ``given`` may change.

    ``flags`` are the options given on this command line (flags, ``--dim``, or config paths, ``arch.embed_dim``).
    Each is compared with the saved run. A change the run cannot honour (architecture, data, batch, optimisation,
    seed: rule ``fixed``) is a :class:`~vitlab.errors.ConfigError` that lists every difference as
    ``--flag saved -> given``. A change it can honour (``honoured``) is applied and reported in one line through
    ``log``; ``--epochs`` also re-plans ``state["plan"]`` to the new number of epochs. Options not given keep the
    saved run's values. ``None`` (a library call, which cannot say what was given): only ``--save-every`` and a
    relaxed ``--on-nan`` are taken from ``given``.

    ``--out``, ``--stop-after``, ``--no-progress``, ``--workers`` and ``--memory-budget`` describe this process and
    the machine it runs on, not the run (``process``): they are always taken from ``given``.

    The saved data location is data read from a file, never trust: it is checked again as if typed
    (:func:`~vitlab.data.shards.source.open_source`), and ``--allow-pipe`` (``pipe:`` URLs run a shell command)
    holds only when given on this command line together with the same ``--data``, spelled exactly as saved."""
    saved = TrainConfig.from_dict(json.loads(state["config"]))
    trained = trained_recipe(state)
    if flags is None:
        paths = {"save_every"} | ({"on_nan"} if given.on_nan != "stop" else set())
    else:
        paths = {p for f in flags if (p := path_of(f)) is not None}
    process = {o.path: getattr(given, o.path) for o in OPTIONS if o.resume == "process" and o.path != "allow_pipe"}
    same_data = str(saved.data).strip() == str(given.data).strip()
    allow_pipe = pipe_trusted(given.allow_pipe, paths) and same_data  # (None: a library call typed nothing)
    cfg = dataclasses.replace(saved, **process, allow_pipe=allow_pipe)  # type: ignore[arg-type]
    plan = state.get("plan", {})
    refused, applied = [], []
    for row in OPTIONS:
        path = row.path
        if path not in paths or row.resume not in ("fixed", "honoured"):
            continue
        was, now = _value(saved, path, recipe=trained), _value(given, path)
        if path == "recipe.epochs":
            was = plan.get("epochs", was)  # a --time-budget run planned its own number of epochs
        if _same(path, was, now):
            continue
        change = f"{flag_for(path)} {_show(was)} -> {_show(now)}"
        if row.resume == "fixed":
            refused.append(change)
        elif path == "recipe.epochs":
            applied.append(change + _more_epochs(cfg, state, plan, now))
        else:
            setattr(cfg, path, now)
            applied.append(change)
    if refused:
        raise ConfigError(
            f"--resume: {given.out} was started with other settings, which a resumed run cannot change: "
            f"{', '.join(refused)}; drop the flag(s), or start a new run (--out elsewhere or --overwrite)"
        )
    if applied and log is not None:
        log(f"--resume: applied {', '.join(applied)}")
    return cfg


def _more_epochs(cfg: TrainConfig, state: dict[str, Any], plan: dict[str, Any], epochs: int) -> str:
    """Re-plan to ``epochs`` (``plan``, saved in ``state``, changes in place: the user asked it on this command line,
    and the run's sizing follows); what it means for the run."""
    done = int(state.get("epoch", 0))
    cfg.recipe = dataclasses.replace(cfg.recipe, epochs=epochs)
    if isinstance(state.get("sizing"), str):
        sizing = json.loads(state["sizing"])
        sizing["recipe"]["epochs"] = epochs
        state["sizing"] = json.dumps(sizing)
    plan.update(epochs=epochs, total_steps=epochs * plan["steps_per_epoch"])
    if epochs <= done:
        return f" ({done} epoch(s) already done: the run finishes now)"
    return f" (the run continues to step {plan['total_steps']}; the learning-rate schedule now ends there)"


def _value(cfg: TrainConfig, path: str, *, recipe: Recipe | None = None) -> Any:
    """The value of option ``path`` in ``cfg`` (``recipe``: the one the run trains with, for a recipe field: the
    fitted one); the architecture as the model is built, so that a flag equal to the recipe's value is no change."""
    if path.startswith("recipe."):
        return getattr(recipe or cfg.recipe, path.removeprefix("recipe."))
    if path.startswith("arch."):
        return arch.compared(cfg).get(path.removeprefix("arch."))
    if path == "model":
        return cfg.model or cfg.recipe.model
    if path == "norm_stats":  # not given: the training set's, as ``data`` names them
        return cfg.norm_stats or (None if cfg.init else "data")
    return getattr(cfg, path)


def _same(path: str, was: Any, now: Any) -> bool:
    if path in ("data", "init", "teacher", "cache_dir") and isinstance(was, str) and isinstance(now, str):
        a, b = Path(was).expanduser(), Path(now).expanduser()
        if a.exists() and b.exists():
            return a.resolve() == b.resolve()
        return was.strip().lower() == now.strip().lower()
    if isinstance(was, float) or isinstance(now, float):
        return was is not None and now is not None and abs(was - now) <= 1e-12 * max(abs(was), abs(now))
    return was == now


def _show(v: Any) -> str:
    """A value as the command line spells it."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return ",".join(_show(x) for x in v)
    return str(v)
