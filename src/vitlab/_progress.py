"""The one progress logger of every long loop (training steps, evaluation batches, feature
extraction, the decode cache): a redrawn bar when stderr is a terminal, plain lines otherwise.

A bar written with ``\\r`` into a file (``vitlab train > log 2>&1``, a job scheduler, CI, ``tee``)
leaves one very long line of redraws; what such a reader wants is one line per epoch and one every
N steps, each ending in a newline. So the mode is chosen by where the output goes, the way pip,
git and the Hugging Face CLI choose theirs: a bar only on a TTY.

Lines that must always be seen (one per training epoch) go through :meth:`ProgressLog.line`, which
prints them above a live bar (``tqdm.write``) or as they are, with or without ``--no-progress``.

A job that ends within :data:`QUIET_S` seconds prints no count lines at all off a terminal: ten lines
saying ``[0 s]`` tell a reader of the log nothing the next line does not.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

__all__ = ["QUIET_S", "ProgressLog", "is_tty"]

QUIET_S = 2.0
"""Seconds a loop runs before its first count line is printed off a terminal (a bar on a terminal is drawn
at once); a loop that ends sooner prints none."""

T = TypeVar("T")


def is_tty(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced by an object without isatty
        return False


class ProgressLog:
    """Progress of one loop of ``total`` units (steps, batches, images).

    ``enabled=False`` (``--no-progress``) draws nothing, but :meth:`line` still prints; ``silent`` (a process
    whose output nobody reads: the other ranks under torchrun) prints nothing, not even :meth:`line`. On a TTY
    (``stream``, default stderr) a tqdm bar is drawn; elsewhere a plain line
    ``<desc>: <unit> <done>/<total> (<pct>%) k=v ... [<seconds> s]`` is printed every ``every`` units (default:
    a tenth of ``total``; 0: never) and, unless just printed, when the loop closes, once the loop has run for
    ``quiet_s`` seconds (default :data:`QUIET_S`): a loop that ends sooner prints no count line. Used as a
    context manager, or around an iterable with :meth:`wrap`; the subset of tqdm's interface the
    loops use (``update``, ``set_postfix``, ``total``, ``close``) is kept so a bar and a log are
    interchangeable."""

    def __init__(
        self,
        *,
        total: int | None,
        desc: str,
        unit: str = "step",
        initial: int = 0,
        enabled: bool = True,
        every: int | None = None,
        leave: bool = True,
        stream: TextIO | None = None,
        quiet_s: float | None = None,
        silent: bool = False,
    ) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.silent = silent
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.enabled = enabled and not silent
        self.stream = stream
        self.every = every if every is not None else (max(1, -(-total // 10)) if total else 0)
        self.postfix: dict[str, Any] = {}
        self._printed_at = initial
        self._t0 = time.perf_counter()
        self._bar: Any = None
        if self.enabled and is_tty(stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit=unit,
                leave=leave,
                dynamic_ncols=True,
                file=stream if stream is not None else sys.stderr,
            )

    @property
    def plain(self) -> bool:
        """True when progress is written as plain lines (enabled, not a terminal)."""
        return self.enabled and self._bar is None

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_total(self, total: int) -> None:
        """A new ``total`` (a re-planned run)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def set_postfix(self, **values: Any) -> None:
        """Values shown after the count (``loss=0.512``); the bar shows them at once, a line at its next print."""
        self.postfix = values
        if self._bar is not None:
            self._bar.set_postfix(**values)

    def update(self, n: int = 1) -> None:
        """``n`` more units done."""
        before, self.n = self.n, self.n + n
        if self._bar is not None:
            self._bar.update(n)
        elif self.plain and self.every and self.n // self.every > before // self.every and self._speaks():
            self._print_count()

    def line(self, msg: str) -> None:
        """Print ``msg`` on stdout whatever the mode (an epoch's summary), above a live bar when there is one (not at
        all when ``silent``)."""
        if self.silent:
            return
        if self._bar is not None:
            from tqdm.auto import tqdm

            tqdm.write(msg, file=sys.stdout)
        else:
            print(msg, flush=True)

    def wrap(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items``, counting one unit each; closes the log at the end."""
        try:
            for item in items:
                yield item
                self.update(1)
        finally:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self.enabled = False  # closed: no further output of either kind
        elif self.plain:
            if self.every and self.n != self._printed_at and self._speaks():
                self._print_count()
            self.enabled = False

    def _speaks(self) -> bool:
        """Whether count lines are printed yet: the loop has run for ``quiet_s`` seconds."""
        return time.perf_counter() - self._t0 >= self.quiet_s

    def _print_count(self) -> None:
        self._printed_at = self.n
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        extra = "".join(f" {k}={v}" for k, v in self.postfix.items())
        elapsed = time.perf_counter() - self._t0
        stream = self.stream if self.stream is not None else sys.stderr
        print(f"{self.desc}: {self.unit} {self.n}{of}{pct}{extra} [{elapsed:.0f} s]", file=stream, flush=True)
