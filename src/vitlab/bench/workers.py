"""Timing one step of a built side, in this process (:class:`InProcess`) or in a worker process
of its own (:class:`WorkerProcess`); both answer ``step()`` with (seconds, minor page faults)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..devices import cap_threads
from ..errors import ConfigError
from .sides import Built, Side, build_side
from .stats import sync

__all__ = ["InProcess", "WorkerProcess", "minor_faults", "num_threads", "timed_call"]


def minor_faults() -> int | None:
    """Minor page faults of this process so far (None where ``resource`` is missing, e.g. Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed_call(step: Callable[[], object], dev: torch.device) -> tuple[float, int | None]:
    """One call of ``step``: (seconds, minor page faults or None), the device synchronised before and after."""
    sync(dev)
    f0 = minor_faults()
    t0 = time.perf_counter()
    step()
    sync(dev)
    dt = time.perf_counter() - t0
    f1 = minor_faults()
    return dt, None if f0 is None or f1 is None else f1 - f0


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[int]:
    """``torch.set_num_threads(n)`` for the block (None: leave torch's choice); yields the count in use."""
    prev = torch.get_num_threads()
    if n is not None:
        if n <= 0:
            raise ConfigError(f"threads: must be positive, got {n}")
        torch.set_num_threads(cap_threads(n)[0])  # no more than the cores there are
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(prev)


class InProcess:
    """A side built and timed in this process."""

    def __init__(self, side: Side, progress: bool = False) -> None:
        self.built = build_side(side, progress=progress)
        self._dev = torch.device(side.device)

    def step(self) -> tuple[float, int | None]:
        """One timed step: (seconds, minor page faults or None)."""
        return timed_call(self.built.step, self._dev)

    def close(self) -> None:
        pass


def _serve(conn: Any, side: Side) -> None:
    """Worker process of a :class:`WorkerProcess`: build ``side``, then time one step per request."""
    try:
        with num_threads(side.threads):
            built = build_side(side)
            info = dataclasses.replace(built, step=None)  # type: ignore[arg-type]
            conn.send(("ready", info))
            dev = torch.device(side.device)
            while conn.recv() == "step":
                conn.send(timed_call(built.step, dev))
    except Exception as e:  # report it to the parent, which raises it there
        conn.send(("error", e))
    finally:
        conn.close()


class WorkerProcess:
    """A side built and timed in a worker process of its own: its own heap, so another model's
    allocations cannot change its page faults. The process starts with this process's
    environment as it is at construction (e.g. ``VITLAB_NATIVE``); an error while building
    is raised here. ``close()`` (or leaving a ``with`` block) stops it."""

    def __init__(self, side: Side) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # no fork of a process that has OpenMP threads running
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, side), daemon=True)
        self._proc.start()
        child.close()
        kind, payload = self._conn.recv()
        if kind == "error":
            self.close()
            raise payload
        self.built: Built = payload

    def step(self) -> tuple[float, int | None]:
        """One timed step in the worker: (seconds, the worker's minor page faults or None)."""
        self._conn.send("step")
        reply = self._conn.recv()
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            raise reply[1]
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send("stop")
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
