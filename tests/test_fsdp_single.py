"""``--fsdp`` in one process (a process group of one): the speed paths of ``vitlab.accel`` stand aside for
sharded modules, what ``--fsdp`` refuses, and sharded checkpoints under faults (a save that fails half-way,
SIGKILL at random moments, a missing folder). The two-process runs are in ``test_train_fsdp.py``."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vitlab
from conftest import assert_close_rel, sigkill_after
from imagefolder import tiny_folder
from vitlab.accel import FastVisionTransformer, blocks, inference_path, training_path
from vitlab.cli import main
from vitlab.distributed import setup, teardown
from vitlab.models import VisionTransformer
from vitlab.train.engine import parallel as fsdp
from vitlab.train.engine.parallel import ddp_memory_hint, shard
from vitlab.train.persist.state import load_state

TINY = ["--recipe", "digits", "--batch-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "2"]
TINY += ["--heads", "2", "--crop-scale", "1,1", "--no-progress", "--workers", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("fsdp1") / "rgb")


def args(data_dir, out, *extra: str) -> list[str]:
    return [
        "train",
        "--data",
        str(data_dir),
        "--out",
        str(out),
        "--cache-dir",
        str(out.parent / "cache"),
        *TINY,
        *extra,
    ]


@pytest.fixture
def group():
    setup("cpu", group=True)
    yield
    teardown()


@pytest.mark.slow
def test_speed_paths_stand_aside_for_sharded_modules(group, monkeypatch):
    """FSDP2 swaps each block's class for an ``FSDPFastBlock`` and gathers its weights in hooks around its
    forward: the fused training node and the oneDNN inference path must not run (they keep per-layer state
    of the full weights between calls), and the plain forward gives the plain model's results."""
    torch.manual_seed(0)
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 3}
    fast = FastVisionTransformer(**cfg)
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(0.2 * torch.randn_like(p))  # no zero-initialised head hiding a term
    plain = VisionTransformer(fast.config)
    plain.load_state_dict(fast.state_dict())
    assert training_path(fast) != "autograd"  # the fused blocks apply to this model until it is sharded
    shard(fast, device=torch.device("cpu"), amp_dtype=None)
    assert type(fast.blocks[0]).__name__ == "FSDPFastBlock" and isinstance(fast.blocks[0], blocks.FastBlock)

    def boom(*_a, **_k):
        raise AssertionError("a speed path ran on a sharded block")

    monkeypatch.setattr(blocks.fused_block, "block_forward", boom)
    monkeypatch.setattr(blocks.onednn, "block_forward", boom)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 0])
    for model in (fast.train(), plain.train()):
        F.cross_entropy(model(x), y).backward()
    assert training_path(fast) == "autograd"
    for (name, p), q in zip(fast.named_parameters(), plain.parameters(), strict=True):
        assert_close_rel(p.grad.full_tensor(), q.grad, msg=name)
    fast.eval(), plain.eval()
    with torch.no_grad():
        assert_close_rel(fast(x), plain(x))
    assert inference_path(fast, x) == "aten"


@pytest.mark.slow
def test_fsdp_refuses_what_it_does_not_combine_with(data_dir, tmp_path, capsys):
    for extra, name in ((["--ema", "0.99"], "--ema"), (["--time-budget", "1m"], "--time-budget")):
        assert main(args(data_dir, tmp_path / "x", "--fsdp", *extra)) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"vitlab train: error: --fsdp with {name}: not supported (") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    # the checkpoint's format follows --fsdp: a resumed run keeps it
    assert main(args(data_dir, tmp_path / "ddp", "--epochs", "1", "--stop-after", "1")) == 0
    assert main(["train", "--out", str(tmp_path / "ddp"), "--resume", "--fsdp", "--no-progress"]) == 2
    assert "--fsdp off -> on" in capsys.readouterr().err


def test_ddp_suggests_fsdp_when_the_model_states_fill_half_a_device():
    h14 = 632_045_800  # ViT-H/14: 16 bytes a parameter = 9.4 GiB under DDP
    assert ddp_memory_hint(h14, world_size=8, device_memory=80 * 2**30) is None
    line = ddp_memory_hint(h14, world_size=8, device_memory=16 * 2**30)
    assert line == (
        "note: weights, gradients and AdamW state take 9.4 GiB on each of the 8 devices under DDP (16 GiB each); "
        "--fsdp shards them (1.2 GiB each; see vitlab plan)"
    )
    assert ddp_memory_hint(h14, world_size=1, device_memory=16 * 2**30) is None  # nothing to shard over


def test_lockstep_runs_blank_forwards_until_every_rank_is_done(monkeypatch):
    """A rank whose evaluation shard has fewer batches keeps calling the sharded forward (a collective) while
    another rank still has batches; what it yields is only its own batches, and the global RNG is untouched."""
    from vitlab.distributed import Dist

    others = iter([True, True, True, False])  # after this rank's one batch, another has three more
    monkeypatch.setattr(fsdp, "any_rank", lambda flags, d: [flags[0] or next(others)])
    calls = []
    net = VisionTransformer(img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    net.register_forward_hook(lambda m, a, out: calls.append(a[0].shape))
    batch = (torch.zeros(5, 3, 8, 8), torch.zeros(5, dtype=torch.long))
    rng = torch.get_rng_state()
    got = list(fsdp.lockstep([batch], net=net, d=Dist(0, 2, 0), device=torch.device("cpu"), amp_dtype=None))
    assert len(got) == 1 and got[0] is batch  # (evaluate() forwards it)
    assert calls == [torch.Size([1, 3, 8, 8])] * 3
    assert torch.equal(torch.get_rng_state(), rng)


def _fail_half_way(self, plan, planner):
    """``FileSystemWriter.write_data`` dying after part of a shard is written (a full disk)."""
    (Path(self.path) / "__0_0.distcp").write_bytes(b"half")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.slow
def test_a_save_that_fails_half_way_leaves_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    from torch.distributed.checkpoint import FileSystemWriter

    out = tmp_path / "run"
    assert main(args(data_dir, out, "--fsdp", "--epochs", "2", "--stop-after", "2")) == 0
    before = load_state(out / "last.pt")
    assert before["step"] == 2 and (out / before["sharded"] / ".metadata").is_file()
    capsys.readouterr()

    monkeypatch.setattr(FileSystemWriter, "write_data", _fail_half_way)  # DCP gathers the failure from its rank
    resume = ["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "cannot write the sharded checkpoint (No space left on device); the previous checkpoint is kept" in err
    assert err.count("\n") == 1
    after = load_state(out / "last.pt")
    assert after["sharded"] == before["sharded"] and after["step"] == 2
    assert [p.name for p in (out / "sharded").glob(".*.tmp")]  # what the failed save left
    monkeypatch.undo()

    assert main(resume) == 0
    final = load_state(out / "last.pt")
    assert final["step"] == 12
    assert [p.name for p in (out / "sharded").iterdir()] == [final["sharded"].split("/")[-1]]  # the .tmp is gone

    # the folder last.pt names, gone: a one-line error, not a traceback
    import shutil

    shutil.rmtree(out / final["sharded"])
    assert main([*resume, "--epochs", "3"]) == 2
    assert "the sharded checkpoint last.pt names is missing" in capsys.readouterr().err


def _spawn(argv):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vitlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


@pytest.mark.slow
def test_sigkill_then_resume_finishes_as_if_never_killed(data_dir, tmp_path):
    """SIGKILL a one-process ``--fsdp`` run at random moments (checkpoints every few steps): each time
    ``last.pt`` names a complete sharded folder, and the resumed run ends with the uninterrupted run's weights."""
    epochs = ["--epochs", "10"]  # 60 steps (AdamW: the sharded optimizer state is saved and resumed)
    full = tmp_path / "full"
    assert main(args(data_dir, full, "--fsdp", *epochs)) == 0
    out = tmp_path / "killed"
    rng = random.Random(21)
    kills, steps = 0, []
    for _ in range(3):
        resume = (out / "last.pt").is_file()
        argv = ["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0"] if resume else []
        argv = argv or args(data_dir, out, "--fsdp", *epochs, *(["--overwrite"] if out.exists() else []))
        proc = _spawn([*argv, "--save-every", "0.0005"])  # minutes: a checkpoint every few steps
        # after its 1st to 3rd save (an event, not a time: on a busy machine every kill once landed before any)
        kills += sigkill_after(proc, saved=out / "last.pt", saves=rng.randint(1, 3), delay=rng.uniform(0.0, 0.05))
        if (out / "last.pt").is_file():
            state = load_state(out / "last.pt")
            assert (out / state["sharded"] / ".metadata").is_file()  # complete, whenever the kill came
            assert not steps or state["step"] >= steps[-1]
            steps.append(state["step"])
    assert kills >= 2 and steps, (kills, steps)
    assert main(["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0"]) == 0  # in this process
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["interrupted"]) == (60, False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 11))
    a, b = vitlab.load(full / "model").state_dict(), vitlab.load(out / "model").state_dict()
    for k in a:
        assert_close_rel(b[k], a[k], msg=k)
    final = load_state(out / "last.pt")["sharded"].split("/")[-1]
    assert [p.name for p in (out / "sharded").iterdir()] == [final]
