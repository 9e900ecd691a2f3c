"""Helpers shared by the tests.

Two tiers: tests that run a whole training command (``vitlab train``/``finetune``, torchrun, a killed and resumed
run, a benchmark script) or take seconds each are marked ``slow``; ``make test-fast`` (``pytest -m "not slow"``)
runs the rest for the inner loop, ``make test`` (CI) runs both. Tests that only need *a* trained run to evaluate,
export, inspect or resume share one, trained once per session: the ``finished_run`` fixture (a generated image
folder) or ``finished_digits_run`` (the embedded digits), read-only; ``copy_run`` gives a copy to write into.

``assert_close_rel`` compares two outputs relative to the reference's size, for parity tests on unnormalised
outputs (logits, features, parameters): an absolute tolerance of 1e-5 on logits of size ~20 asks for a relative
error of 5e-7, which float32 GEMMs summed in another order (1 or 2 threads, AVX2, AVX-512, AMX) do not promise.
Import it with ``from conftest import assert_close_rel`` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
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


def counting_passes(table: dict[int, float], default: float):
    """``(passes, calls)``: a stand-in for the passes a time budget buys at each side (the side rule's measurement),
    ``table``'s value for a side it names and ``default`` for the others; ``calls`` lists the sides asked, in order."""
    calls: list[int] = []

    def passes(side: int) -> float:
        calls.append(side)
        return table.get(side, default)

    return passes, calls


def slow_cases(values, slow) -> list:
    """``values`` for ``pytest.mark.parametrize`` with those in ``slow`` marked ``slow`` (seconds each: the fast
    tier keeps the others' coverage of the same code)."""
    return [pytest.param(v, marks=pytest.mark.slow) if v in slow else v for v in values]


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


# --- one tiny finished run per session, shared ------------------------------------------------------------------

TINY_ARCH = ("--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4")
"""The shared runs' ViT: one block of width 16, two heads, 4-px patches (the smallest the suite trains)."""
QUIET = ("--threads", "1", "--workers", "0", "--no-progress")
"""As the suite's other runs: one torch thread, augmentation in this process, no progress bar."""
RUN_OUTPUTS = ("model", "last.pt", "metrics.jsonl", "summary.json", "config.yaml", "sizing.json")


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file under ``folder``: what a write changes."""
    return {
        p.relative_to(folder).as_posix(): (st.st_size, st.st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (st := p.stat())
    }


def _train_shared(root: Path, argv: list[str]) -> None:
    """``vitlab train argv`` in this process, its printed lines kept in ``root/stdout.txt``. torch's thread count
    and the random generators are left as they were: the test that happens to ask for the run first runs as if the
    run had been there already."""
    from vitlab.cli import main

    threads = torch.get_num_threads()
    rngs = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        torch.set_num_threads(threads)
        random.setstate(rngs[0])
        np.random.set_state(rngs[1])
        torch.random.set_rng_state(rngs[2])
    (root / "stdout.txt").write_text(out.getvalue())
    assert code == 0, f"the shared run failed: vitlab {' '.join(argv)}\n{err.getvalue()}"


def _shared_run(root: Path, argv: list[str], *, watched: tuple[Path, ...]) -> Iterator[Path]:
    """Train the run of ``argv`` (its ``--out`` is ``root/run``), yield its folder, and at the session's end fail
    naming any file under ``watched`` that a test added, changed or removed (the run is read-only by contract)."""
    run = root / "run"
    _train_shared(root, argv)
    missing = [name for name in RUN_OUTPUTS if not (run / name).exists()]
    assert not missing, f"the shared run wrote no {', '.join(missing)}"
    before = {str(w): _files(w) for w in watched}
    yield run
    for w in watched:
        now = _files(w)
        changed = sorted(k for k in before[str(w)].keys() | now.keys() if before[str(w)].get(k) != now.get(k))
        assert not changed, f"a test wrote into the shared {w} (copy it first: copy_run): {', '.join(changed)}"


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Iterator[Path]:
    """A finished tiny classification run on a generated image folder (``tests/imagefolder.py``: 3 classes, 48
    training and 12 test images of 8x8 px): ``--recipe digits``, 2 epochs of 3 steps of 16, the TINY_ARCH ViT.
    Its folder holds model/, last.pt, metrics.jsonl, summary.json, config.yaml, sizing.json, curves.png and
    confusion.png; its decode cache is ``finished_run.parent / "cache"``, what training printed
    ``finished_run_stdout``.

    Trained once per session: once per pytest-xdist worker, each in its own ``tmp_path_factory`` folder.
    Read-only by contract, as is its data (``finished_run_data``, recorded in the run by its absolute path): a test
    that writes into a run (eval's eval.json, inspect's default folder, an export next to the model, ``--resume``,
    an edited last.pt) works on ``copy_run(finished_run, tmp_path)`` or the ``run_copy`` fixture. A write into
    the run or its data fails the session at its end, naming the files."""
    from imagefolder import tiny_folder

    root = tmp_path_factory.mktemp("finished-run")
    data = tiny_folder(root / "data")
    argv = ["train", "--data", str(data), "--out", str(root / "run"), "--cache-dir", str(root / "cache")]
    argv += ["--recipe", "digits", "--epochs", "2", "--batch-size", "16", *TINY_ARCH, *QUIET]
    yield from _shared_run(root, argv, watched=(root / "run", data))


@pytest.fixture(scope="session")
def finished_run_data(finished_run) -> Path:
    """The image folder ``finished_run`` was trained on (``train/`` and ``test/``, classes class0..class2)."""
    return finished_run.parent / "data"


@pytest.fixture(scope="session")
def finished_run_stdout(finished_run) -> str:
    """What training ``finished_run`` printed (its standard output)."""
    return (finished_run.parent / "stdout.txt").read_text()


@pytest.fixture(scope="session")
def finished_digits_run(tmp_path_factory) -> Iterator[Path]:
    """As ``finished_run``, on the embedded 8x8 digits (vitlab train's default data, 10 classes): 2 epochs of batch
    64, the TINY_ARCH ViT. Read-only by contract: write into ``copy_run(finished_digits_run, tmp_path)``."""
    root = tmp_path_factory.mktemp("finished-digits-run")
    argv = ["train", "--out", str(root / "run"), "--epochs", "2", "--batch-size", "64", *TINY_ARCH, *QUIET]
    yield from _shared_run(root, argv, watched=(root / "run",))


def copy_run(run: Path, dest: Path) -> Path:
    """A copy of the run folder ``run`` at ``dest / run.name`` (links copied as links), for a test to write into.
    Its data is still the shared run's (a run records its data by absolute path): copy that too to change it."""
    return Path(shutil.copytree(run, dest / run.name, symlinks=True))


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A copy of ``finished_run`` in this test's ``tmp_path``, to write into."""
    return copy_run(finished_run, tmp_path)
