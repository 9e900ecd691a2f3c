"""Helpers shared by the tests.

``assert_close_rel`` compares two outputs relative to the reference's size, for parity tests on unnormalised
outputs (logits, features, parameters): an absolute tolerance of 1e-5 on logits of size ~20 asks for a relative
error of 5e-7, which float32 GEMMs summed in another order (1 or 2 threads, AVX2, AVX-512, AMX) do not promise.
Import it with ``from conftest import assert_close_rel`` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on two cores: one torch thread each
    torch.set_num_threads(1)

# Float32 parity between two implementations of the same arithmetic (vitlab against timm, Hugging Face, a
# JAX .npz, an exported graph): reordered float32 sums differ by ~1e-6 of the output's size (at most 2.7e-6
# measured, a timm hybrid with its ResNet stem, with 1 and 2 threads), so 1e-5 leaves a margin and still fails
# on any real error (a wrong eps, activation, weight layout or missing bias is 1e-3 or more).
F32_RTOL = 1e-5


def _float64(x) -> torch.Tensor:
    return (x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))).double()


def rel_err(actual, expected) -> float:
    """max |actual - expected| / max |expected| (max-norm relative error), in float64."""
    a, b = _float64(actual), _float64(expected)
    assert a.shape == b.shape, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else float("inf")


def assert_close_rel(actual, expected, rtol: float = F32_RTOL, msg: str = "") -> None:
    """Assert max |actual - expected| <= rtol * max |expected| (torch tensors or NumPy arrays of one shape).

    The scale is the reference's largest magnitude, not each element's, so entries near zero do not make the
    check flaky; an all-zero reference demands exact equality. NaN anywhere fails.
    """
    err = rel_err(actual, expected)
    if not err <= rtol:
        a, b = _float64(actual), _float64(expected)
        diff, scale = (a - b).abs().max().item(), b.abs().max().item()
        where = f"{msg}: " if msg else ""
        raise AssertionError(f"{where}max |diff| {diff:.3g} = {err:.3g} x max |expected| {scale:.3g} > rtol {rtol:.3g}")


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def default_stop_signals() -> None:
    """``preexec_fn`` for a child that a test sends SIGINT/SIGTERM/SIGHUP: their default dispositions.
    A shell starts background jobs with SIGINT ignored (and ``nohup`` ignores SIGHUP); a child inherits
    that, and vitlab keeps a signal ignored that was ignored when the run began."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL)


@pytest.fixture
def default_signals():
    """The stop signals at their default dispositions in this process for one test, then restored."""
    prev = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    default_stop_signals()
    yield
    for s, h in prev.items():
        signal.signal(s, h)


@pytest.fixture
def step_lrs(monkeypatch) -> list[float]:
    """The LR after each optimizer step of the runs a test makes (read in ``Trainer._on_step``)."""
    from vitlab.train.engine import trainer

    lrs: list[float] = []
    on_step = trainer.Trainer._on_step

    def record(self, res, loss):
        lrs.append(self.opt.scheduler.get_last_lr()[0])
        return on_step(self, res, loss)

    monkeypatch.setattr(trainer.Trainer, "_on_step", record)
    return lrs


@pytest.fixture
def step_losses(monkeypatch) -> list[float]:
    """The loss of every optimizer step (the mean over its micro-batches) of the runs a test makes, as the
    trainer sees it (read in ``Trainer._on_step``)."""
    from vitlab.train.engine import trainer

    seen: list[float] = []
    on_step = trainer.Trainer._on_step

    def record(self, res, loss):
        seen.append(loss)
        return on_step(self, res, loss)

    monkeypatch.setattr(trainer.Trainer, "_on_step", record)
    return seen


@pytest.fixture(autouse=True)
def _no_network_probe(monkeypatch):
    """Tests never touch the network: the Hub counts as reachable (downloads are mocked per test);
    a test that wants it unreachable patches ``vitlab.checkpoints.hub._unreachable`` itself."""
    from vitlab.checkpoints import hub

    monkeypatch.setattr(hub, "_unreachable", lambda endpoint, **kw: None)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes each time a writer renames a new file over ``path`` (None: no file there)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def sigkill_after(
    proc: subprocess.Popen,
    *,
    delay: float = 0.0,
    wait_for_start: bool = True,
    saved: Path | None = None,
    saves: int = 1,
    timeout: float = 300,
) -> bool:
    """SIGKILL a ``vitlab train`` child at an event of its run, if it is still running; reap it. True: it was killed.

    The events, never a time since the start: its start line (``training ...``, ``resuming ...`` or already
    complete); then, with ``saved`` (its ``last.pt``), the ``saves``-th time that file is replaced (each save renames
    a new file over it), so that a kill lands after a save however slow the machine; then ``delay`` seconds more
    (a random moment after the event). Without ``wait_for_start``: ``delay`` seconds after the call (a kill during
    start-up, wherever it lands). ``timeout``: the longest wait for the events (a run that hangs fails the test)."""
    if wait_for_start:
        for line in proc.stdout:
            if line.startswith(("training ", "resuming ")) or "already complete" in line:
                break
    if saved is not None:
        last, seen, deadline = _stamp(saved), 0, time.monotonic() + timeout
        while seen < saves and proc.poll() is None:
            assert time.monotonic() < deadline, f"the run did not save {saved} {saves} time(s) in {timeout} s"
            now = _stamp(saved)
            if now != last and now is not None:
                seen, last = seen + 1, now
            else:
                time.sleep(0.005)  # polling the file for the event (the kernel has no portable notification here)
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return killed


@pytest.fixture(autouse=True, scope="session")
def _private_decode_cache(tmp_path_factory):
    """The suite never writes into the user's ``~/.cache/vitlab``: every decode cache a test (or a ``vitlab``
    child process, which inherits the environment) builds without its own ``cache_dir`` goes to a folder of this
    session's. A test of the default location sets or deletes ``VITLAB_CACHE`` itself."""
    import os

    old = os.environ.get("VITLAB_CACHE")
    os.environ["VITLAB_CACHE"] = str(tmp_path_factory.mktemp("vitlab-cache"))
    yield
    if old is None:
        os.environ.pop("VITLAB_CACHE", None)
    else:
        os.environ["VITLAB_CACHE"] = old
