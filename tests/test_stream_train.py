"""``vitlab train`` / ``eval`` on tar shards: stopped mid-epoch and resumed, no sample of an epoch is seen twice or
skipped, and the run is the uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.data.shards.stream import TRACE_ENV
from vitlab.train.persist.state import load_state

ARGS = ["--epochs", "2", "--batch-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "2", "--heads", "2"]
ARGS += ["--img-size", "8", "--shuffle-buffer", "10", "--seed", "1", "--no-progress"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream_train")
    folder = tiny_folder(root / "rgb", per_class=16, test_per_class=4)  # 48 train: 6 steps of 8 an epoch
    one = (folder / "train" / "class0" / "00.png").stat().st_size
    assert main(["data", "pack", str(folder), str(root / "packed"), "--shard-size", str(5 * one), "--no-progress"]) == 0
    return root / "packed"


def trace(path) -> list[tuple[int, int, str]]:
    """(epoch, position, key) of every sample the training loop took, in order."""
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    return [(int(e), int(p), k) for r, e, p, k in rows]


@pytest.fixture(scope="module")
def full_run(packed, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TRACE_ENV, str(out / "trace.tsv"))
        assert main(["train", "--data", str(packed), "--out", str(out / "run"), "--workers", "0", *ARGS]) == 0
    return out


@pytest.mark.slow
def test_stopped_mid_epoch_and_resumed_sees_every_sample_once(packed, full_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "trace.tsv"))
    run = tmp_path / "run"
    assert main(["train", "--data", str(packed), "--out", str(run), "--workers", "0", "--stop-after", "4", *ARGS]) == 0
    state = load_state(run / "last.pt")
    assert (state["epoch"], state["step"], state["samples_in_epoch"]) == (0, 4, 32)  # mid-epoch: 4 of 6 steps
    assert len(trace(tmp_path / "trace.tsv")) == 32  # batches fetched but not trained on are not listed
    # resumed with DataLoader workers this time: the order does not depend on them
    assert main(["train", "--out", str(run), "--resume", "--workers", "2", "--no-progress"]) == 0
    assert "resuming" in capsys.readouterr().out

    seen = trace(tmp_path / "trace.tsv")
    for epoch in (0, 1):
        rows = [(p, k) for e, p, k in seen if e == epoch]
        assert [p for p, _ in rows] == list(range(48)), f"epoch {epoch}: positions repeated or skipped"
        assert len({k for _, k in rows}) == 48  # every training sample once
    assert seen == trace(full_run / "trace.tsv")  # the uninterrupted run's samples, in its order

    a, b = load_state(full_run / "run" / "last.pt"), load_state(run / "last.pt")
    for k, v in a["model"].items():  # augmentation is seeded per sample: the same crops whichever process decodes
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=0, msg=k)


def test_eval_reads_the_packed_folder_and_a_pattern(packed, full_run, tmp_path, capsys):
    model = full_run / "run" / "model"
    assert main(["eval", "--model", str(model), "--data", str(packed), "--output", str(tmp_path / "a.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["count"] == 12 and a["split"] == "test"
    pattern = f"{packed}/test-{{000000..000002}}.tar"
    assert main(["eval", "--model", str(model), "--data", pattern, "--output", str(tmp_path / "b.json")]) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["count"] == 12 and b["top1"] == a["top1"]
    summary = json.loads((full_run / "run" / "summary.json").read_text())
    assert summary["data"]["shards"] == {"train": 10, "test": 3}
    assert main(["eval", "--model", str(model), "--data", "hf:cifar10"]) != 0
    assert "not built" in capsys.readouterr().err
    # --val-split on shards holds out their last training shards (as training does), never a fraction of each class
    assert main(["eval", "--model", str(model), "--data", str(packed), "--val-split", "0.2", "--json",
                 "--output", str(tmp_path / "c.json")]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert json.loads(out.out)["count"] == 2 * 4  # the last 2 of 10 shards of 4
    assert "of each class" not in out.err and "no val/ or test/" not in out.err
    assert "8 images of its last training shards (20% of them, rounded, at least one), held out as" in out.err


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--fsdp", "--grad-checkpointing"]], ids=["ddp", "fsdp"])
def test_two_processes_stopped_mid_epoch_resume_on_one(packed, full_run, tmp_path, monkeypatch, extra):
    """torchrun with 2 gloo processes (DDP, or FSDP2 with activation checkpointing and sharded checkpoints),
    stopped after 4 of 6 steps, resumed by one process: the epoch's remaining samples, each once, and the same
    samples at the same positions as the single-process run."""
    out, log = tmp_path / "run", tmp_path / "trace.tsv"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", TRACE_ENV: str(log)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "vitlab"]
    cmd += ["train", "--data", str(packed), "--out", str(out), "--workers", "1", "--stop-after", "4", *ARGS, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if proc.returncode != 0 and "training vit_" not in proc.stdout:  # torchrun's rendezvous port race: once more
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = load_state(out / "last.pt")
    assert state["samples_in_epoch"] == 32
    assert ("sharded" in state) == bool(extra)  # FSDP: the weights are in a DCP folder, not in last.pt
    monkeypatch.setenv(TRACE_ENV, str(log))  # the resume on one process: this one
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    seen = trace(log)
    assert {r for r, *_ in (line.split("\t") for line in log.read_text().splitlines())} == {"0", "1"}
    for epoch in (0, 1):
        rows = {p: k for e, p, k in seen if e == epoch}
        assert sorted(rows) == list(range(48)) and len([1 for e, *_ in seen if e == epoch]) == 48
    assert sorted(seen) == sorted(trace(full_run / "trace.tsv"))
    assert json.loads((out / "summary.json").read_text())["steps"] == 12
