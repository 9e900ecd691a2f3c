"""Every failure of a DataLoader ends the run: a worker's error becomes one line, and no worker outlives it.

The training DataLoaders' workers ignore SIGINT, SIGTERM and SIGHUP
(:func:`vitlab.train.engine.signals.ignore_stop_signals`: a stop signal sent to the whole process group must not kill
them while the training process finishes its step and saves). Two consequences are handled here:

- PyTorch re-raises a worker's exception in the training process with the worker's whole traceback as its
  message; :func:`batches` turns it into one :class:`~vitlab.errors.DataError` line (the worker's own
  message when it is a vitlab error), and shuts the iterator's workers down (killing any that do not stop)
  as soon as the iteration ends, normally or not.
- At interpreter exit, :mod:`multiprocessing` terminates daemonic children (DataLoader workers are) with
  SIGTERM and then waits for them: workers that ignore SIGTERM would keep the process from ever exiting (the
  workers of an iterator still referenced at exit, whose shutdown PyTorch skips then). :func:`_end_workers_at_exit`,
  registered after multiprocessing's own handler so that it runs first, kills the workers of the loaders
  :func:`batches` iterated that are still alive.
- :mod:`multiprocessing`'s temporary folder is made in the training process before it starts workers
  (:func:`workers_share_temp_dir`), so that no worker removes a folder of its own as it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util  # (imported before ours registers: its exit handler runs after ours)
import re
import signal
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from ... import errors
from ...errors import DataError, VitlabError

__all__ = ["Batches", "batches", "worker_error_line", "workers_share_temp_dir"]

_WORKER = re.compile(r"^Caught (\w+) in DataLoader worker process (\d+)\.")


def worker_error_line(e: BaseException) -> str:
    """One line for an exception raised while a DataLoader produced a batch: the worker's own message when
    PyTorch re-raised a worker's exception (``Caught X in DataLoader worker process N`` followed by the
    worker's traceback), without its type when it was a vitlab error (which names the file and what to do)."""
    text = str(e)
    m = _WORKER.match(text)
    if m is None:
        first = text.splitlines()[0] if text.strip() else ""
        return f"data loading failed: {type(e).__name__}: {first}" if first else f"data loading failed: {e!r}"
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(" ")]
    last = lines[-1] if lines else m.group(1)
    kind, _, msg = last.partition(": ")
    kind = kind.rsplit(".", 1)[-1]
    if _is_vitlab_error(kind) and msg:
        return msg
    return f"data loader worker {m.group(2)} failed: {kind}: {msg}" if msg else f"data loader worker failed: {kind}"


def _is_vitlab_error(name: str) -> bool:
    cls = getattr(errors, name, None)
    return isinstance(cls, type) and issubclass(cls, VitlabError)


def _stop_workers(it: Iterator[Any]) -> None:
    """End a DataLoader iterator's workers now: PyTorch's own shutdown, then SIGKILL for any still alive
    (they ignore SIGTERM, which is what PyTorch's shutdown sends to workers that do not stop)."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()  # also stops watching the workers for SIGCHLD, so that killing one below raises nothing
    with contextlib.suppress(Exception):
        for w in getattr(it, "_workers", ()):
            if w.is_alive():
                w.kill()
                w.join(timeout=5)


def workers_share_temp_dir() -> None:
    """Make :mod:`multiprocessing`'s temporary folder in this process before it starts DataLoader workers: they
    inherit it, and only this process removes it, at its exit, once its workers have ended. A worker that made its
    own removed it as it exited while its queue's thread could still be making a socket there (the one PyTorch
    passes a tensor's file descriptor through): ``rmtree`` failed and the worker printed multiprocessing's
    traceback beside the run's one error line (a shard broken mid-run with 2 workers, one CI run in five)."""
    multiprocessing.util.get_temp_dir()


def batches(loader: Iterable[Any]) -> Iterator[Any]:
    """The batches of ``loader`` (a DataLoader); an exception while producing one is a one-line
    :class:`~vitlab.errors.DataError` (:func:`worker_error_line`; the original is its ``__cause__``, shown with
    ``--debug``), and the loader's workers are ended when the iteration ends, whatever ends it."""
    if getattr(loader, "num_workers", 0):
        workers_share_temp_dir()
    it = iter(loader)
    _WORKERS.update(getattr(it, "_workers", ()))
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except Exception as e:
                if isinstance(e, VitlabError) and not _WORKER.match(str(e)):  # raised in this process: one line
                    raise
                raise DataError(worker_error_line(e)) from e
            yield batch
    finally:
        _stop_workers(it)


class Batches:
    """A DataLoader iterated through :func:`batches` (iterable again, e.g. for each evaluation)."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return batches(self.loader)


_WORKERS: weakref.WeakSet = weakref.WeakSet()
"""The worker processes of the loaders :func:`batches` iterated (a process object is forgotten with its iterator)."""


def _end_workers_at_exit() -> None:
    alive = [w for w in list(_WORKERS) if w.is_alive()]
    if not alive:
        return
    if hasattr(signal, "SIGCHLD") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # PyTorch's handler would raise at each worker killed
    for w in alive:
        with contextlib.suppress(Exception):
            w.kill()
    for w in alive:
        with contextlib.suppress(Exception):
            w.join(timeout=5)


atexit.register(_end_workers_at_exit)
