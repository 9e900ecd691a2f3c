"""``--fsdp`` with two gloo processes through torchrun on a tiny model: the same training as DDP and as one
process, and sharded checkpoints that resume on another number of processes (2 -> 1 and 1 -> 2).

One torchrun launch runs every two-process command (``tests/torchrun_worker.py``); the one-process runs
go in this process. SGD keeps the comparison tight: its update is linear in the gradient, so the
processes' different summation order stays at float32 rounding (Adam's normalised update can turn a
rounding difference in a near-zero gradient into a full-size step). The crop covers the whole image
(``--crop-scale 1,1``), so augmentation draws no different pixels on different ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitlab
from conftest import F32_RTOL, assert_close_rel
from imagefolder import tiny_folder
from vitlab.cli import main

pytestmark = pytest.mark.slow  # end to end: every test here reads the runs of torchrun (the module fixture `runs`)

TINY = ["--recipe", "digits", "--epochs", "2", "--batch-size", "8", "--patch-size", "4", "--dim", "16"]
TINY += ["--depth", "2", "--heads", "2", "--crop-scale", "1,1", "--no-progress", "--workers", "0"]
SGD = ["--optimizer", "sgd", "--lr", "0.05"]
STEPS = 12  # 48 images / 8 a step = 6 steps an epoch, 2 epochs


def torchrun(commands: list[list[str]], *, cwd: Path) -> str:
    """Run ``commands`` (``vitlab`` argument lists) in two gloo processes of one torchrun launch; rank 0's output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    src = str(Path(vitlab.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    worker = str(Path(__file__).with_name("torchrun_worker.py"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", worker]
    cmd.append(json.dumps(commands))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, cwd=cwd)
    if proc.returncode != 0 and "training vit_" not in proc.stdout:
        # torchrun failed to launch (its standalone rendezvous picks a free port, which another process can take
        # first): one more launch; a launch that started training and failed is never retried
        first = proc.stderr[-1500:]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, cwd=cwd)
        assert proc.returncode == 0, f"first launch:\n{first}\nsecond launch:\n{proc.stderr[-1500:]}"
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The run folders: ``single`` (one process, no FSDP), ``ddp``, ``fsdp``, ``fsdp_gc`` (with activation
    checkpointing and two accumulation steps), ``two_to_one`` (two processes to step 3, then resumed by one;
    ``two_to_one_saved`` is its checkpoint at step 3), ``one_to_two`` (the other way round)."""
    root = tmp_path_factory.mktemp("fsdp")
    data = tiny_folder(root / "data")

    def args(name: str, *extra: str) -> list[str]:
        where = ["--data", str(data), "--out", str(root / name), "--cache-dir", str(root / "cache")]
        return ["train", *where, *TINY, *SGD, *extra]

    def resume(name: str) -> list[str]:
        return ["train", "--out", str(root / name), "--resume", "--no-progress", "--workers", "0"]

    assert main(args("single")) == 0
    assert main(args("one_to_two", "--fsdp", "--stop-after", "3")) == 0  # --fsdp without torchrun: a group of one
    log = torchrun(
        [
            args("ddp"),
            args("fsdp", "--fsdp"),
            args("fsdp_gc", "--fsdp", "--grad-checkpointing", "--accum-steps", "2"),
            args("two_to_one", "--fsdp", "--stop-after", "3"),
            resume("one_to_two"),
        ],
        cwd=root,
    )
    shutil.copytree(root / "two_to_one", root / "two_to_one_saved")
    assert main(resume("two_to_one")) == 0
    return root, log


def weights(run: Path) -> dict[str, torch.Tensor]:
    model = vitlab.load(run / "model")
    assert type(model).__name__ == "FastVisionTransformer"  # a plain model, not an FSDP class
    return model.state_dict()


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_training(run: Path, ref: Path, *, train_loss: bool) -> None:
    """The same weights and per-epoch evaluation loss as ``ref`` (and training loss: it is rank 0's micro-batches)."""
    a, b = weights(run), weights(ref)
    assert a.keys() == b.keys()
    for k in a:
        assert_close_rel(a[k], b[k], msg=f"{run.name} {k}")
    rows, ref_rows = metrics(run), metrics(ref)
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows] == [STEPS // 2, STEPS]
    keys = ("eval_loss", "train_loss") if train_loss else ("eval_loss",)
    for r, e in zip(rows, ref_rows, strict=True):
        for k in keys:
            assert abs(r[k] - e[k]) <= F32_RTOL * abs(e[k]), (run.name, k, r[k], e[k])


def test_fsdp_trains_as_ddp_and_as_one_process(runs):
    root, log = runs
    assert "FSDP2: 5,379 parameters sharded over 2 process(es), 2 blocks + root, fp32" in log
    assert metrics(root / "single")[-1]["eval_loss"] < 0.95 * metrics(root / "single")[0]["train_loss"]  # it learns
    assert_same_training(root / "ddp", root / "single", train_loss=False)
    assert_same_training(root / "fsdp", root / "ddp", train_loss=True)
    assert_same_training(root / "fsdp", root / "single", train_loss=False)
    assert_same_training(root / "fsdp_gc", root / "single", train_loss=False)
    for name in ("fsdp", "fsdp_gc"):
        summary = json.loads((root / name / "summary.json").read_text())
        assert (summary["processes"], summary["steps"]) == (2, STEPS)
        state = torch.load(root / name / "last.pt", weights_only=True)
        assert "model" not in state and "optimizer" not in state  # they are in the sharded folder it names
        assert [p.name for p in (root / name / "sharded").iterdir()] == [Path(state["sharded"]).name]


def test_saved_by_two_processes_resumed_by_one(runs):
    """The resumed run continues the two-process run as if it had not stopped; and the state it loads (weights
    and momentum) is the saved one, bit for bit (read back through the single-file conversion of DCP)."""
    root, _ = runs
    assert_same_training(root / "two_to_one", root / "fsdp", train_loss=False)
    summary = json.loads((root / "two_to_one" / "summary.json").read_text())
    assert (summary["processes"], summary["steps"], summary["interrupted"]) == (1, STEPS, False)

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from vitlab.distributed import setup, teardown
    from vitlab.train.conf.train_config import TrainConfig
    from vitlab.train.engine.optim import build_optimization
    from vitlab.train.engine.parallel import shard
    from vitlab.train.persist.dcp import read_sharded

    saved_dir = root / "two_to_one_saved"
    state = torch.load(saved_dir / "last.pt", weights_only=True)
    assert state["step"] == 3 and state["micro_in_epoch"] == 3
    dcp_to_torch_save(saved_dir / state["sharded"], root / "two_to_one_saved.pt")
    saved = torch.load(root / "two_to_one_saved.pt", weights_only=True)
    cfg = TrainConfig.from_dict(json.loads(state["config"]))
    setup("cpu", group=True)
    try:
        net = shard(vitlab.load(root / "single" / "model"), device=torch.device("cpu"), amp_dtype=None)
        opt = build_optimization(
            net,
            recipe=cfg.recipe,
            lr=0.05,
            total_steps=STEPS,
            warmup_steps=1,
            device=torch.device("cpu"),
            use_scaler=False,
        )
        read_sharded(saved_dir / state["sharded"], net=net, optimizer=opt.optimizer)
        full = StateDictOptions(full_state_dict=True)
        model_now = get_model_state_dict(net, options=full)
        optim_now = get_optimizer_state_dict(net, opt.optimizer, options=full)
    finally:
        teardown()
    assert model_now.keys() == saved["model"].keys()
    for k, v in saved["model"].items():
        assert torch.equal(model_now[k], v), k
    assert optim_now["state"].keys() == saved["optim"]["state"].keys()
    for k, per_param in saved["optim"]["state"].items():
        assert per_param.keys() == {"momentum_buffer"}
        assert torch.equal(optim_now["state"][k]["momentum_buffer"], per_param["momentum_buffer"]), k


def test_saved_by_one_process_resumed_by_two(runs):
    root, log = runs
    assert f"resuming {root / 'one_to_two'} at epoch 1, step 3/{STEPS}" in log
    assert_same_training(root / "one_to_two", root / "single", train_loss=False)
    summary = json.loads((root / "one_to_two" / "summary.json").read_text())
    assert (summary["processes"], summary["steps"], summary["interrupted"]) == (2, STEPS, False)
    assert [r["epoch"] for r in metrics(root / "one_to_two")] == [1, 2]
