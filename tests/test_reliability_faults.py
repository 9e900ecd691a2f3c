"""Nothing is lost under faults: SIGKILL at random moments, a full disk, a NaN/Inf loss."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import assert_close_rel, sigkill_after
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.train.objectives import classify as classify_mod
from vitlab.train.persist.state import load_state

EPOCHS = 20  # 3 steps per epoch: 60 steps


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("faults") / "rgb")


def train_args(data_dir, out, *, epochs=EPOCHS, extra=()):
    return [
        "train",
        "--data",
        str(data_dir),
        "--out",
        str(out),
        "--cache-dir",
        str(out.parent / "cache"),
        "--recipe",
        "small-data",
        "--epochs",
        str(epochs),
        "--batch-size",
        "16",
        "--warmup-epochs",
        "1",
        "--patch-size",
        "4",
        "--dim",
        "16",
        "--depth",
        "1",
        "--heads",
        "2",
        "--workers",
        "0",
        "--threads",
        "1",
        "--no-progress",
        *extra,
    ]


def _spawn(argv):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vitlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_completes(data_dir, tmp_path):
    """Kill a real run with SIGKILL again and again; every time ``last.pt`` must load, its step never
    goes back, ``--resume`` continues, and the finished run equals an uninterrupted one."""
    full = tmp_path / "full"
    assert main(train_args(data_dir, full)) == 0
    full_summary = json.loads((full / "summary.json").read_text())
    assert full_summary["steps"] == 3 * EPOCHS

    out = tmp_path / "killed"
    save = ["--save-every", "0.0005"]  # minutes: a checkpoint every ~30 ms, i.e. every few steps
    rng = random.Random(1234)
    saved_steps: list[int] = []
    kills = 0
    for attempt in range(4):
        resume = (out / "last.pt").is_file()
        argv = (
            ["train", "--out", str(out), "--resume", "--workers", "0", "--no-progress", *save]
            if resume
            # killed before its first checkpoint: start again, replacing what the dead run left
            else train_args(data_dir, out, extra=[*save, *(["--overwrite"] if out.exists() else [])])
        )
        proc = _spawn(argv)
        if attempt == 0:  # a kill during start-up (imports, decoding): nothing to lose, nothing broken
            kills += sigkill_after(proc, delay=rng.uniform(0.2, 1.0), wait_for_start=False)
        else:  # a kill at a random moment of the training loop: after its 1st to 3rd save, however slow the machine
            kills += sigkill_after(proc, saved=out / "last.pt", saves=rng.randint(1, 3), delay=rng.uniform(0.0, 0.05))
        if (out / "last.pt").is_file():
            state = load_state(out / "last.pt")  # intact: loads with weights_only=True
            assert not saved_steps or state["step"] >= saved_steps[-1], [*saved_steps, state["step"]]
            saved_steps.append(state["step"])
            if state["step"] >= 3 * EPOCHS:
                break
    assert kills >= 3 and len(saved_steps) >= 2, (kills, saved_steps)

    assert main(["train", "--out", str(out), "--resume", "--workers", "0", "--no-progress"]) == 0  # in this process
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["epochs"], summary["interrupted"]) == (3 * EPOCHS, EPOCHS, False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1))  # each epoch once: none lost, none repeated
    # Exact resume (augmentation in the training process): the same weights as never being killed.
    a, b = load_state(full / "last.pt")["model"], load_state(out / "last.pt")["model"]
    for k in a:
        assert_close_rel(b[k], a[k], msg=k)
    assert vitlab.load(out / "model").config.num_classes == 3
    assert not list(out.glob(".last.pt.tmp*"))  # half-written files of killed processes were cleaned up


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.slow
def test_disk_full_while_saving_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(train_args(data_dir, out, epochs=3, extra=["--stop-after", "3"])) == 0
    assert load_state(out / "last.pt")["step"] == 3
    capsys.readouterr()
    monkeypatch.setattr(torch, "save", _enospc)
    assert main(["train", "--out", str(out), "--resume", "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "previous last.pt is kept" in err, err
    monkeypatch.undo()
    assert load_state(out / "last.pt")["step"] == 3  # still readable, still the old one
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]  # no partial file left to fill the disk


def test_disk_full_while_saving_the_model_folder(tmp_path, monkeypatch):
    from vitlab.checkpoints import vitlab_folder as native
    from vitlab.models import VisionTransformer, ViTConfig

    model = VisionTransformer(
        ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    )
    vitlab.save(model, tmp_path / "m")
    monkeypatch.setattr(native, "save_file", _enospc)
    with pytest.raises(
        vitlab.CheckpointError,
        match="cannot write the model .No space left on device.; the previous files there are kept",
    ):
        vitlab.save(model, tmp_path / "m", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    vitlab.load(tmp_path / "m")


def _nan_at(monkeypatch, calls: set[int]):
    """Make the training loss NaN on the given (1-based) micro-batches."""
    real = torch.nn.functional
    n = {"calls": 0}

    def cross_entropy(*a, **k):
        n["calls"] += 1
        loss = real.cross_entropy(*a, **k)
        return loss * float("nan") if n["calls"] in calls else loss

    monkeypatch.setattr(classify_mod, "F", types.SimpleNamespace(cross_entropy=cross_entropy))


@pytest.mark.slow
def test_nan_loss_stops_by_default_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _nan_at(monkeypatch, {5})  # step 5: in epoch 2, after epoch 1's checkpoint (step 3)
    assert main(train_args(data_dir, out, epochs=3)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (
        "training loss is nan" in err and "global step 5" in err and "last.pt (step 3) holds the last good state" in err
    ), err
    state = load_state(out / "last.pt")
    assert state["step"] == 3 and all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.slow
def test_nan_loss_skip_counts_and_finishes(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _nan_at(monkeypatch, {2, 7})
    assert main(train_args(data_dir, out, epochs=3, extra=["--on-nan", "skip"])) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["nan_skipped"]) == (9, 2)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("nan_skipped", 0) for r in rows] == [1, 0, 1]
    assert all(np.isfinite(r["train_loss"]) for r in rows)
    assert all(torch.isfinite(v).all() for v in load_state(out / "last.pt")["model"].values())


def test_half_written_files_of_killed_processes_are_removed(tmp_path):
    """A SIGKILL mid-write leaves ``.last.pt.tmp<pid>`` or a dataset-sized ``<cache>.tmp<pid>``: the next writer deletes
    those whose process is gone, never those of a live process."""
    from vitlab.data.cache.store import decode_files
    from vitlab.train.persist.state import atomic_torch_save

    dead = 999_999_999  # beyond any pid_max: no such process
    (tmp_path / f".last.pt.tmp{dead}").write_bytes(b"x" * 1000)
    (tmp_path / f".last.pt.tmp{os.getppid()}").write_bytes(b"live writer")
    atomic_torch_save({"step": 1}, tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", f".last.pt.tmp{os.getppid()}"])

    img = tmp_path / "a.png"
    Image.new("RGB", (4, 4)).save(img)
    cache = tmp_path / "cache"
    decode_files([str(img)], cache_dir=cache, name="x", progress=False)
    (meta,) = cache.glob("x-*.json")
    stale = meta.with_suffix(f".tmp{dead}")
    stale.write_bytes(b"\0" * 4096)
    meta.unlink()  # forces a rebuild
    decode_files([str(img)], cache_dir=cache, name="x", progress=False)
    assert not stale.exists() and meta.exists()
