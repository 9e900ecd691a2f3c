"""Stop signals (Ctrl-C, SIGTERM, SIGHUP) as a request to finish the current step, save and stop."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignals", "StoppedBeforeTraining", "ignore_stop_signals"]


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
"""Ctrl-C, a scheduler's or ``kill``'s request to end, a closed terminal or SSH session."""


class StoppedBeforeTraining(KeyboardInterrupt):
    """A stop signal that arrived while the run was starting (data, model, plan): there is nothing to
    save yet, so the run ends at once, through every ``finally`` (the run folder's lock is released)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} before training began; nothing to save")
        self.signum = signum


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP as a request to finish the current step, save and stop.

    In a single-process run, a signal that arrives before :meth:`training` is called (the run is
    still starting: data, model, plan) raises :class:`StoppedBeforeTraining` at once, and a second
    signal during training interrupts at once (Ctrl-C twice: :class:`KeyboardInterrupt`; SIGTERM,
    SIGHUP: their default action). Otherwise a signal only sets :attr:`signum`, which the training
    loop reads after each step. Under torchrun (``single_process=False``) every rank listens from
    the start and the ranks agree on stopping (the trainer all-reduces the flag): torchrun forwards
    SIGTERM, SIGINT and SIGHUP to each worker, the workers reach it at different moments, and one
    rank ending alone would break the others' collectives. A repeat is ignored there, because the
    same signal reaches a worker twice (from the terminal and forwarded by torchrun), and torchrun
    kills its workers after its own timeout anyway. A signal that was ignored when the run began
    (``nohup`` ignores SIGHUP) stays ignored. Inactive outside the main thread, where Python cannot
    install handlers."""

    def __init__(self, *, single_process: bool) -> None:
        self.escalate = single_process
        self.signum: int | None = None
        self._training = not single_process
        self._prev: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        """The signal that asked to stop, e.g. ``"SIGTERM"`` (None: none did)."""
        return signal.Signals(self.signum).name if self.signum is not None else None

    def training(self) -> None:
        """Training has begun: from now on a signal asks to save and stop instead of ending the run."""
        self._training = True

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                prev = signal.getsignal(s)
                if prev is not signal.SIG_IGN:
                    self._prev[s] = prev
                    signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, prev in self._prev.items():
            signal.signal(s, prev)
        self._prev.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._training:
            raise StoppedBeforeTraining(signum)
        if self.signum is None:
            self.signum = signum
            return
        if not self.escalate:
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, self._prev.get(signum, signal.SIG_DFL))  # the default: end the process now
        os.kill(os.getpid(), signum)


def ignore_stop_signals(worker_id: int) -> None:
    """``worker_init_fn`` of the DataLoaders: a signal sent to the whole process group (Ctrl-C, a
    scheduler) must not kill the workers while the training process finishes its step and saves;
    they end with it (:mod:`vitlab.data.pipeline.loading` ends them, killing those that linger, whatever ends the
    run)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
