"""Exact resume mid-epoch: a run stopped in the middle of an epoch (``--stop-after`` or SIGTERM) and resumed ends with
the metrics rows and the weights of the run that never stopped, bit for bit, on an image folder (the default ``auto``
recipe, with every random augmentation on) and on tar shards, with 0, 1 or 2 data workers (the number may change at
the resume), on one process and on two (torchrun, gloo).

Each sample's augmentation is drawn from its own generator, seeded by (seed, epoch, sample)
(:mod:`vitlab.data.pipeline.seeding`), so that neither the workers nor where the resumed loader starts can change it,
and the training process's own generators (MixUp/CutMix, stochastic depth, token dropping) are saved and restored at the
step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.train.engine import trainer
from vitlab.train.persist.state import load_state

pytestmark = pytest.mark.slow  # end to end: every test here trains, stops and resumes runs

# 24 training images of 16 px: the auto recipe picks a batch of 8, i.e. 3 steps an epoch, 9 in all
RUN = ["--epochs", "3", "--dim", "16", "--depth", "1", "--heads", "2", "--seed", "3", "--threads", "1"]
# every random path of a run at once: crops, RandAugment, flips, erasing, MixUp/CutMix, stochastic depth, token
# dropping, and an EMA of the weights
RUN += ["--crop-scale", "0.35,1", "--randaugment", "2,9", "--random-erasing", "0.25", "--mixup", "0.8"]
RUN += ["--cutmix", "1.0", "--drop-path", "0.1", "--token-drop", "0.25", "--ema", "0.9", "--no-progress"]
SRC = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])
STOP = 4  # global step 4: one step into the second epoch
KEYS = ("epoch", "step", "train_loss", "lr", "top1", "top5", "eval_loss")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """``--data`` of each loader: the image folder (with its decode cache) and the same images packed as shards."""
    root = tmp_path_factory.mktemp("exact")
    folder = tiny_folder(root / "rgb", per_class=8, test_per_class=2, size=16)
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    assert main(["data", "pack", str(folder), str(root / "packed"), "--shard-size", str(3 * one), "--no-progress"]) == 0
    return {
        "folder": ["--data", str(folder), "--cache-dir", str(root / "cache")],
        "shards": ["--data", str(root / "packed"), "--shuffle-buffer", "10"],
    }


def outcome(out) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The run's metrics rows (what does not depend on the clock) and its final weights and EMA weights."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    state = load_state(out / "last.pt")
    weights = {f"model.{k}": v for k, v in state["model"].items()}
    weights |= {f"ema.{k}": v for k, v in (state["ema"] or {}).items()}
    return [{k: r[k] for k in KEYS} for r in rows], weights


def assert_same(got, want) -> None:
    rows, weights = got
    assert rows == want[0]  # floats compared exactly
    assert weights.keys() == want[1].keys()
    for k, v in want[1].items():
        assert torch.equal(weights[k], v), k


@pytest.fixture(scope="module")
def uninterrupted(sources, tmp_path_factory):
    """Each loader's run that never stopped (no data workers: augmentation in the training process)."""
    got = {}
    for name, data in sources.items():
        out = tmp_path_factory.mktemp("full") / name
        assert main(["train", *data, "--out", str(out), "--workers", "0", *RUN]) == 0
        got[name] = outcome(out)
        assert [r["step"] for r in got[name][0]] == [3, 6, 9]
    return got


@pytest.fixture
def sigterm_at_step(monkeypatch, default_signals):
    """A real SIGTERM to this process just before optimizer step ``STOP`` completes (the run's stop handler takes
    it: it finishes the step, saves and stops, as with a scheduler's SIGTERM)."""
    on_step = trainer.Trainer._on_step

    def send(self, res, loss):
        if self.position.step == STOP - 1 and self.position.steps_this_run == STOP - 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return on_step(self, res, loss)

    monkeypatch.setattr(trainer.Trainer, "_on_step", send)


@pytest.mark.parametrize(
    ("loader", "workers", "how", "resume_workers"),
    [
        ("folder", 0, "stop-after", 0),
        ("folder", 1, "sigterm", 2),
        ("folder", 2, "stop-after", 1),
        ("shards", 0, "sigterm", 1),
        ("shards", 1, "stop-after", 2),
        ("shards", 2, "sigterm", 0),
    ],
)
def test_stopped_mid_epoch_and_resumed_is_the_uninterrupted_run(
    request, sources, uninterrupted, tmp_path, loader, workers, how, resume_workers
):
    out = tmp_path / "run"
    argv = ["train", *sources[loader], "--out", str(out), "--workers", str(workers), *RUN]
    if how == "sigterm":
        request.getfixturevalue("sigterm_at_step")
    else:
        argv += ["--stop-after", str(STOP)]
    assert main(argv) == (128 + signal.SIGTERM if how == "sigterm" else 0)  # a signal: the shell's 128 + its number
    state = load_state(out / "last.pt")
    assert (state["epoch"], state["step"], state["micro_in_epoch"]) == (1, STOP, 1)  # mid-epoch
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary.get("signal") == ("SIGTERM" if how == "sigterm" else None)

    resume = ["train", "--out", str(out), "--resume", "--workers", str(resume_workers), "--no-progress"]
    assert main(resume) == 0
    assert_same(outcome(out), uninterrupted[loader])


WORKER = str(Path(__file__).with_name("torchrun_worker.py"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", WORKER]


def _torchrun(*runs: list[str], env: dict[str, str]) -> None:
    """``vitlab`` with each of ``runs``' arguments, one after another, on the two processes of one torchrun launch
    (the launch and the imports paid once); a launch that failed before training (torchrun's rendezvous port race)
    is tried once more."""
    cmd = [*TORCHRUN, json.dumps(list(runs))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0 and "training vit_" not in proc.stdout:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(("loader", "workers"), [("folder", 1), ("shards", 2)])
def test_two_processes_stopped_mid_epoch_and_resumed_are_the_uninterrupted_two_process_run(
    sources, tmp_path, loader, workers
):
    """Two processes (torchrun, gloo): the resumed run equals the two-process run that never stopped. (Not the
    one-process run: two processes average their gradients in another order, and each draws its own stochastic
    depth.)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": SRC}
    full, part = tmp_path / "full", tmp_path / "part"
    run = ["train", *sources[loader], "--workers", str(workers), *RUN]
    _torchrun([*run, "--out", str(full)], [*run, "--out", str(part), "--stop-after", str(STOP)], env=env)
    assert load_state(part / "last.pt")["step"] == STOP
    # the resume: a launch of its own (fresh processes, as after a real stop)
    _torchrun(["train", "--out", str(part), "--resume", "--workers", str(workers), "--no-progress"], env=env)
    assert_same(outcome(part), outcome(full))
