"""Every failure ends the process: a data loader that fails mid-run (a shard truncated or deleted while the run reads
it, a worker that cannot read an image) ends the run with one error line and a non-zero exit, with 0, 1 or 2 data
workers and under torchrun, and leaves no process behind; a time budget of years is planned at once."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.train.sizing.budget import steps_in_budget as _steps_in_budget

ARCH = ["--dim", "16", "--depth", "1", "--heads", "2", "--no-progress", "--threads", "1"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
# torch's advice when a loader starts more worker processes than the machine lends it cores (two workers on a one-core
# runner): a line about the machine running the tests, not about the failure under test, so the children ignore it
QUIET = {"PYTHONWARNINGS": "ignore:This DataLoader will create:UserWarning", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("hangs") / "rgb", per_class=8, test_per_class=2, size=16)


@pytest.fixture(scope="module")
def packed(folder):
    out = folder.parent / "packed"
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    assert main(["data", "pack", str(folder), str(out), "--shard-size", str(3 * one), "--no-progress"]) == 0
    return out


def processes_of(marker: str) -> list[int]:
    """The pids of live processes whose command line holds ``marker`` (the run's own folder: the training
    processes, their DataLoader workers and torchrun share it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def run_and_break(argv: list[str], *, marker: str, damage, timeout: float = 180) -> tuple[int, str]:
    """Start ``python argv``, call ``damage()`` once its first epoch is done, then wait for it to end (a hang fails
    the test, after killing what it started). Returns the exit code and stderr."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **QUIET}
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("epoch 1/"):
            break
    damage()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *processes_of(marker)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the run did not end within {timeout} s of the failure")
    deadline = time.monotonic() + 30
    while processes_of(marker) and time.monotonic() < deadline:  # torchrun's other rank may take a moment
        time.sleep(0.2)
    left = processes_of(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    return proc.returncode, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("vitlab train: error: ")]


def truncate_train_shards(root: Path):
    def damage():
        for p in root.glob("train-*.tar"):
            os.truncate(p, p.stat().st_size // 2)

    return damage


def delete_shards(root: Path):
    def damage():
        for p in root.glob("*.tar"):
            p.unlink()

    return damage


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("fault", ["truncated", "deleted"])
def test_a_shard_that_breaks_mid_run_ends_the_run(packed, tmp_path, workers, fault):
    data = tmp_path / "shards"
    data.mkdir()
    for p in packed.iterdir():
        (data / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "run"
    argv = ["-m", "vitlab", "train", "--data", str(data), "--out", str(out), "--epochs", "50"]
    damage = truncate_train_shards(data) if fault == "truncated" else delete_shards(data)
    rc, err = run_and_break([*argv, "--workers", str(workers), *ARCH], marker=str(out), damage=damage)
    assert rc == 2, err[-3000:]
    assert err.count("\n") == 1 and len(error_lines(err)) == 1, err[-3000:]  # one line, no traceback
    assert ".tar" in err and "and --resume" in err, err
    assert not (out / ".lock").exists()


DRIVER = """
import errno, os, sys
from pathlib import Path
import vitlab.data.pipeline.transforms as t

flag, fail_rank = Path(sys.argv[1]), sys.argv[2]
get = t.ArrayDataset.__getitem__


def failing(self, i):  # an image that cannot be read any more, in whichever process reads it
    if flag.exists() and os.environ.get("RANK", "0") == fail_rank:
        raise OSError(errno.EIO, "Input/output error", "cache.u8")
    return get(self, i)


t.ArrayDataset.__getitem__ = failing
from vitlab.cli import main

raise SystemExit(main(sys.argv[3:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_folder_loader_whose_reads_fail_ends_the_run(folder, tmp_path, workers):
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    flag, out = tmp_path / "fail-now", tmp_path / "run"
    argv = [str(driver), str(flag), "0", "train", "--data", str(folder), "--out", str(out), "--epochs", "50"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--workers", str(workers), *ARCH]
    rc, err = run_and_break(argv, marker=str(out), damage=flag.touch)
    assert rc == 2, err[-3000:]
    assert err.count("\n") == 1 and len(error_lines(err)) == 1, err[-3000:]
    assert "OSError: [Errno 5] Input/output error: 'cache.u8'" in err, err
    assert not (out / ".lock").exists()


@pytest.mark.slow
def test_torchrun_a_rank_whose_reads_fail_ends_every_rank(folder, tmp_path):
    """Only rank 0's data fails: it ends with one line, and rank 1, waiting for it in a collective, does not hang."""
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    flag, out = tmp_path / "fail-now", tmp_path / "run"
    argv = [*TORCHRUN, str(driver), str(flag), "0", "train", "--data", str(folder), "--out", str(out)]
    argv += ["--epochs", "50", "--cache-dir", str(tmp_path / "cache"), "--workers", "1", *ARCH]
    rc, err = run_and_break(argv, marker=str(out), damage=flag.touch)
    assert rc != 0, err[-3000:]
    (line,) = error_lines(err)  # rank 0's; rank 1 ends with the broken collective or by torchrun
    assert "OSError: [Errno 5] Input/output error" in line, err[-3000:]


@pytest.mark.slow
def test_torchrun_with_truncated_shards_ends_every_rank(packed, tmp_path):
    data = tmp_path / "shards"
    data.mkdir()
    for p in packed.iterdir():
        (data / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "run"
    argv = [*TORCHRUN, "-m", "vitlab", "train", "--data", str(data), "--out", str(out), "--epochs", "50"]
    rc, err = run_and_break([*argv, "--workers", "1", *ARCH], marker=str(out), damage=truncate_train_shards(data))
    assert rc != 0, err[-3000:]
    assert error_lines(err) and all(".tar" in line for line in error_lines(err)), err[-3000:]


KEPT_ALIVE = """
from torch.utils.data import DataLoader
from vitlab.data.pipeline.loading import batches
from vitlab.train.engine.signals import ignore_stop_signals

loader = DataLoader(range(1000), batch_size=2, num_workers=2, worker_init_fn=ignore_stop_signals)
KEPT = batches(loader)
next(KEPT)  # a loader still iterating when the program ends, kept alive until the interpreter's exit
"""


@pytest.mark.slow
def test_workers_of_a_loader_alive_at_exit_do_not_keep_the_process(tmp_path):
    """multiprocessing's exit handler SIGTERMs daemonic workers and waits for them; these ignore SIGTERM. vitlab's
    own exit handler, which runs first, kills them."""
    marker = str(tmp_path / "kept-alive")
    env = {**os.environ, **QUIET}
    proc = subprocess.Popen([sys.executable, "-c", KEPT_ALIVE, marker], stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *processes_of(marker)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the process did not exit")
    assert proc.returncode == 0 and not err, err
    assert not processes_of(marker)


# -- planning a time budget --------------------------------------------------------------------------------------------


def _steps_in_budget_counting_down(left, per_step, end_s, steps_per_epoch, done=0):
    """The planner as it was: one step at a time from the most that could fit."""

    def cost(n):
        return n * per_step + (math.ceil((done + n) / steps_per_epoch) - done // steps_per_epoch) * end_s

    n = max(1, int(left / per_step))
    while n > 1 and cost(n) > left:
        n -= 1
    return n


@settings(max_examples=300, deadline=None)
@given(
    left=st.floats(-10.0, 500.0, allow_nan=False),
    per_step=st.floats(0.01, 20.0),
    end_s=st.floats(0.0, 50.0),
    steps_per_epoch=st.integers(1, 40),
    done=st.integers(0, 200),
)
def test_the_budget_planner_agrees_with_counting_down(left, per_step, end_s, steps_per_epoch, done):
    want = _steps_in_budget_counting_down(left, per_step, end_s, steps_per_epoch, done)
    assert _steps_in_budget(left, per_step, end_s, steps_per_epoch, done) == want


def test_a_budget_of_a_thousand_days_is_planned_in_few_evaluations():
    """``--time-budget 1000d`` at 1 ms a step: 8.6e10 steps could fit; the plan asks the cost of a few dozen."""

    class Counted(int):  # steps_per_epoch that counts the costs computed (each divides by it once)
        calls = 0

        def __rtruediv__(self, other):
            Counted.calls += 1
            assert Counted.calls <= 64, "the planner walks the steps one by one"
            return int(other) / int(self)

    n = _steps_in_budget(1000 * 86400.0 - 5.0, 0.001, 2.5, Counted(390))
    assert 0 < n < 1000 * 86400 / 0.001 and n * 0.001 + math.ceil(n / 390) * 2.5 <= 1000 * 86400.0 - 5.0
    assert (n + 1) * 0.001 + math.ceil((n + 1) / 390) * 2.5 > 1000 * 86400.0 - 5.0  # the most that fit


SHARED_TEMP = """
import multiprocessing.util
import torch
from torch.utils.data import DataLoader
from vitlab.data.pipeline.loading import batches


class TempDirs(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return multiprocessing.util.get_temp_dir()  # in a worker: the folder it would make, or the one it inherited


seen = [d for b in batches(DataLoader(TempDirs(), batch_size=1, num_workers=2, collate_fn=list)) for d in b]
print(sorted(set(seen)) == [multiprocessing.util.get_temp_dir()])
"""


def test_dataloader_workers_share_the_training_processs_temp_dir():
    """multiprocessing's temporary folder is made before the workers start: a worker that made its own removed it
    at its exit while its queue's thread could still write there (a traceback beside the run's one error line)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SHARED_TEMP], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stdout + done.stderr
