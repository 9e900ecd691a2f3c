"""Follow a run in the tools people already use: a :class:`Tracker` takes the scalars of a step
(``log``), the run's configuration (``log_config``) and is closed at the end (``close``).

    tracker = make_trackers(["csv", "tensorboard"], out=run_dir, config=cfg)
    tracker.log(step, {"train_loss": 0.7, "lr": 1e-3})
    tracker.close()

Backends (:mod:`vitlab.track.backends`): ``csv`` (always there), ``tensorboard``, ``wandb`` and ``mlflow``,
each used through its own library, imported only when asked for (``pip install 'vitlab[tensorboard]'``
and so on); a missing library is one :class:`~vitlab.errors.ConfigError` line naming the extra.

A tracker that talks to a server (MLflow at an ``http(s)://`` URI, W&B online) never holds the run: each of its
calls runs in a thread the caller waits for at most :func:`tracker_timeout` seconds (``$VITLAB_TRACKER_TIMEOUT``,
default 15), and a stop signal ends the wait at once (``stop``). What a tracker cannot do (start, log, finish:
no answer in time, no key, a refusal) is one line: with ``strict`` a :class:`~vitlab.errors.ConfigError`, else
the tracker is off for the rest of the run (``warning: the tracker is off for this run: ...``) and the run goes
on (``vitlab train --strict-log`` stops instead).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT",
    "TIMEOUT_ENV",
    "FanOut",
    "Tracker",
    "check_trackers",
    "make_trackers",
    "tracker_timeout",
]

BACKENDS = ("csv", "tensorboard", "wandb", "mlflow")
"""The names ``make_trackers`` (and ``--log``) accept."""
TIMEOUT_ENV = "VITLAB_TRACKER_TIMEOUT"
"""Environment variable: the seconds a run waits for a tracker's server (:data:`DEFAULT_TIMEOUT` when unset)."""
DEFAULT_TIMEOUT = 15.0
"""Seconds a run waits for a tracker's server to answer one call (start, log, finish) before going on without it."""
CLOSE_FACTOR = 4
"""Finishing a tracker's run waits this many timeouts (at least 60 s): it uploads what is still queued."""
_POLL_S = 0.05
"""How often a wait for a tracker's server looks at the stop signals."""


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
    """Several trackers as one: each call goes to every tracker in turn.

    ``strict`` (the default): a tracker's failure is raised (``close`` closes the others first). Otherwise the
    tracker that failed is dropped for the rest of the run and ``warn`` gets one line saying so."""

    def __init__(
        self, trackers: Iterable[Tracker] = (), *, strict: bool = True, warn: Callable[[str], None] | None = None
    ) -> None:
        self.trackers = list(trackers)
        self.strict = strict
        self.warn = warn or (lambda line: None)

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for t in list(self.trackers):
            try:
                _named(t, call)
            except Exception as e:
                if self.strict:
                    raise
                self.trackers.remove(t)
                self.warn(off_line(e))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._each(lambda t: t.log(step, scalars))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._each(lambda t: t.log_config(config))

    def close(self) -> None:
        """Close every tracker, even when one fails (the first failure is raised after, when ``strict``)."""
        err: BaseException | None = None
        for t in self.trackers:
            try:
                _named(t, lambda t: t.close())
            except Exception as e:  # the others still flush their files
                if not self.strict:
                    self.warn(off_line(e))
                err = err or e
        if err is not None and self.strict:
            raise err


def _named(tracker: Any, call: Callable[[Any], None]) -> None:
    """``call(tracker)``; a failure of a tracker vitlab made (it has a ``logger`` name) as one :class:`ConfigError`
    line naming ``--log NAME``, another tracker's as it is."""
    name = getattr(tracker, "logger", None)
    if name is None:
        call(tracker)
        return
    try:
        call(tracker)
    except Exception as e:
        raise _line(e, f"--log {name}") from None


def _line(e: BaseException, what: str) -> ConfigError:
    """``e`` as one line that starts with ``what`` (``--log NAME`` or ``--log NAME: SERVER``)."""
    if isinstance(e, ConfigError):
        return e if str(e).startswith(what.partition(":")[0]) else ConfigError(f"{what}: {e}")
    return ConfigError(f"{what}: {_one_line(e)}")


def off_line(e: BaseException) -> str:
    """The warning a run prints when a tracker fails and it goes on without it."""
    return f"warning: the tracker is off for this run: {e}; the run goes on without it (--strict-log stops instead)"


def tracker_timeout(timeout: float | None = None) -> float:
    """Seconds to wait for a tracker's server: ``timeout``, else ``$VITLAB_TRACKER_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT`; a positive finite number (a bad value of the variable is one line)."""
    if timeout is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(text)
        except ValueError:
            timeout = math.nan
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"{TIMEOUT_ENV}={text!r}: not a number of seconds (e.g. 15)")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"tracker timeout {timeout!r}: must be a positive number of seconds")
    return float(timeout)


class _Abandoned:
    """A call a caller stopped waiting for: what it returns later is closed (a tracker started too late)."""

    def __init__(self) -> None:
        self.flag = False


def _bounded(fn: Callable[[], Any], *, timeout: float, stop: Callable[[], str | None], what: str) -> Any:
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds and only while ``stop()`` returns None
    (a stop signal's name ends the wait). Its exception is raised here; a wait that ends first raises a
    :class:`ConfigError` ``"{what}: no answer within ... s"`` (or ``"... stopped waiting for it (SIGTERM)"``), and
    a tracker the call starts afterwards is closed by the thread itself."""
    done = threading.Event()
    box: dict[str, Any] = {}
    gone = _Abandoned()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller (or dropped when it stopped waiting)
            box["error"] = e
        finally:
            done.set()
            if gone.flag and hasattr(box.get("value"), "close"):
                with contextlib.suppress(Exception):
                    box["value"].close()

    threading.Thread(target=target, name=f"vitlab-tracker {what}", daemon=True).start()
    deadline = time.monotonic() + timeout
    try:
        while not done.wait(_POLL_S):
            if (sig := stop()) is not None:
                raise ConfigError(f"{what}: stopped waiting for it ({sig})")
            if time.monotonic() >= deadline:
                raise ConfigError(f"{what}: no answer within {timeout:g} s ({TIMEOUT_ENV} to wait longer)")
    except BaseException:
        gone.flag = True  # a signal's exception (a run still starting ends at once) or the lines above
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _one_line(e: BaseException) -> str:
    """A library's exception as a short line: its type and the first line of its message."""
    text = (str(e).strip().splitlines() or [""])[0][:300].rstrip(". ")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _Remote:
    """A tracker of :func:`make_trackers` that talks to a server (``where``): each call runs through
    :func:`_bounded`, so that a silent server never holds the run."""

    def __init__(self, name: str, tracker: Any, *, where: str, timeout: float) -> None:
        self.logger, self.tracker, self.where, self.timeout = name, tracker, where, timeout

    def _call(self, fn: Callable[[], Any], *, timeout: float | None = None) -> None:
        _bounded(fn, timeout=timeout or self.timeout, stop=lambda: None, what=f"--log {self.logger}: {self.where}")

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._call(lambda: self.tracker.log(step, scalars))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._call(lambda: self.tracker.log_config(config))

    def close(self) -> None:
        """Finish the tracker's run: a longer wait than a call's (:data:`CLOSE_FACTOR` x, at least a minute), as
        finishing uploads what is still queued."""
        self._call(self.tracker.close, timeout=max(CLOSE_FACTOR * self.timeout, 60.0))


def _start(
    name: str, make: Callable[[], Any], *, where: str | None, timeout: float, stop: Callable[[], str | None]
) -> Any:
    """The tracker ``make()`` returns, its failure as one :class:`ConfigError` line; one with a server waited for
    through :func:`_bounded` (while ``stop()`` returns None) and wrapped in :class:`_Remote`."""
    what = f"--log {name}" + (f": {where}" if where else "")
    try:
        if where is None:
            return make()
        return _Remote(name, _bounded(make, timeout=timeout, stop=stop, what=what), where=where, timeout=timeout)
    except Exception as e:
        raise _line(e, what) from None


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
    importing it, and the settings each reads from the environment (a W&B project name, the timeout): a run
    refuses them before it loads its data, in the line :func:`make_trackers` gives."""
    from . import backends

    out = _names(names)
    for name in out:
        if name != "csv" and importlib.util.find_spec(name) is None:
            raise ConfigError(f"--log {name}: the {name} package is not installed; pip install 'vitlab[{name}]'")
        backends.check_settings(name)
    if any(name != "csv" for name in out):
        tracker_timeout()
    return out


def make_trackers(
    names: Iterable[str],
    *,
    out: str | os.PathLike[str],
    config: Mapping[str, Any],
    strict: bool = True,
    timeout: float | None = None,
    stop: Callable[[], str | None] | None = None,
    warn: Callable[[str], None] = print,
) -> FanOut:
    """The trackers ``names`` (``csv``, ``tensorboard``, ``wandb``, ``mlflow``; comma-separated items are
    split) writing under the run folder ``out``, with ``config`` logged, as one :class:`FanOut`. None
    asked: a tracker that does nothing.

    A tracker with a server is waited for at most ``timeout`` seconds a call (:func:`tracker_timeout`) and while
    ``stop()`` returns None (the name of a stop signal that arrived ends the wait). With ``strict``, a tracker
    that cannot start is a one-line :class:`ConfigError` (those already started are closed first); otherwise
    ``warn`` gets one line and the others go on, and so for a tracker that fails later (:class:`FanOut`)."""
    from . import backends

    folder = Path(out)
    wanted = _names(names)
    seconds = tracker_timeout(timeout) if any(n != "csv" for n in wanted) else DEFAULT_TIMEOUT
    started: list[Tracker] = []
    try:
        for name in wanted:
            make = lambda name=name: backends.make(name, out=folder)  # noqa: E731
            where = backends.server(name)
            try:
                tracker = _start(name, make, where=where, timeout=seconds, stop=stop or (lambda: None))
            except ConfigError as e:
                if strict:
                    raise
                warn(off_line(e))
                continue
            started.append(tracker)
        fan = FanOut(started, strict=strict, warn=warn)
        fan.log_config(config)
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the start is the one to report
            FanOut(started).close()
        raise
    return fan
