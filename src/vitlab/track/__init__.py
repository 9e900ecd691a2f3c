"""Follow a run in the tools people already use: a :class:`Tracker` takes the scalars of a step
(``log``), the run's configuration (``log_config``) and is closed at the end (``close``).

    tracker = make_trackers(["csv", "tensorboard"], out=run_dir, config=cfg)
    tracker.log(step, {"train_loss": 0.7, "lr": 1e-3})
    tracker.close()

Backends (:mod:`vitlab.track.backends`): ``csv`` (always there), ``tensorboard``, ``wandb`` and ``mlflow``,
each used through its own library, imported only when asked for (``pip install 'vitlab[tensorboard]'``
and so on); a missing library is one :class:`~vitlab.errors.ConfigError` line naming the extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError

__all__ = ["BACKENDS", "FanOut", "Tracker", "check_trackers", "make_trackers"]

BACKENDS = ("csv", "tensorboard", "wandb", "mlflow")
"""The names ``make_trackers`` (and ``--log``) accept."""


@runtime_checkable
class Tracker(Protocol):
    """Where a run's scalars go."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record ``scalars`` (name -> number) at optimizer step ``step``."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Record the run's configuration (JSON-like: nested dicts, lists, strings, numbers)."""

    def close(self) -> None:
        """Flush and finish; the tracker is not used afterwards."""


class FanOut:
    """Several trackers as one: each call goes to every tracker in turn."""

    def __init__(self, trackers: Iterable[Tracker] = ()) -> None:
        self.trackers = list(trackers)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for t in self.trackers:
            t.log(step, scalars)

    def log_config(self, config: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log_config(config)

    def close(self) -> None:
        """Close every tracker, even when one fails (the first failure is raised after)."""
        err: BaseException | None = None
        for t in self.trackers:
            try:
                t.close()
            except Exception as e:  # the others still flush their files
                err = err or e
        if err is not None:
            raise err


def _names(names: Iterable[str]) -> list[str]:
    """``names`` split at commas, lower-cased, checked and deduplicated in order."""
    out: list[str] = []
    for item in names:
        for name in str(item).split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in BACKENDS:
                raise ConfigError(f"--log: unknown logger {name!r}; choose from {', '.join(BACKENDS)}")
            if name not in out:
                out.append(name)
    return out


def check_trackers(names: Iterable[str]) -> list[str]:
    """The backend names of ``names`` (checked, split at commas, deduplicated), each library found without
    importing it: a run refuses a missing one before it loads its data, in the line :func:`make_trackers` gives."""
    out = _names(names)
    for name in out:
        if name != "csv" and importlib.util.find_spec(name) is None:
            raise ConfigError(f"--log {name}: the {name} package is not installed; pip install 'vitlab[{name}]'")
    return out


def make_trackers(names: Iterable[str], *, out: str | os.PathLike[str], config: Mapping[str, Any]) -> FanOut:
    """The trackers ``names`` (``csv``, ``tensorboard``, ``wandb``, ``mlflow``; comma-separated items are
    split) writing under the run folder ``out``, with ``config`` logged, as one :class:`FanOut`. None
    asked: a tracker that does nothing. If one cannot start, those already started are closed."""
    from . import backends

    folder = Path(out)
    started: list[Tracker] = []
    try:
        for name in _names(names):
            tracker = backends.make(name, out=folder)
            started.append(tracker)
            tracker.log_config(config)
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the start is the one to report
            FanOut(started).close()
        raise
    return FanOut(started)
