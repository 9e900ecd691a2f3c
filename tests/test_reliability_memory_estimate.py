"""Memory before the run (:mod:`vitlab.train.sizing.memory`): every run estimates its peak from its configuration
before it allocates, splits the batch into accumulation steps when the step would not fit (same global batch, same
losses), refuses in one line when one image does not fit, and fits ``--objective mpp`` to photos; what is available
is read from ``/proc/meminfo`` and the cgroup's limit. The probe of available memory is stood in for: these tests
test the estimate and the decision, not the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
import vitlab.train.sizing.machine as machine
import vitlab.train.sizing.memory as memory
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.distributed import Dist
from vitlab.errors import ConfigError
from vitlab.models import ViTConfig
from vitlab.train import TrainConfig, fit, get_recipe
from vitlab.train.persist.state import load_state

TINY = {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2}
GiB = 2**30


def _available(n: int):
    return lambda device: (n, "test")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("memfolder") / "data", per_class=11, test_per_class=2, size=16)


def _cfg(folder: Path, out: Path, **kw) -> TrainConfig:
    recipe = get_recipe("digits", epochs=1, batch_size=16, lr=1e-3, warmup_epochs=0, clip_grad=None)
    return TrainConfig(
        recipe=recipe,
        data=str(folder),
        out=str(out),
        arch=TINY,
        cache_dir=str(out.parent / "cache"),
        workers=0,
        progress=False,
        **kw,
    )


@pytest.mark.slow
def test_a_step_that_does_not_fit_is_split_into_accumulation_steps(folder, tmp_path, monkeypatch, capsys, step_losses):
    """With room for a micro-batch of 4 but not 8, a batch of 16 trains as 4 accumulation steps of 4: the same
    global batch, the same first-step loss and the same second-step loss (the first update equal), up to float
    reduction order."""
    losses = step_losses
    monkeypatch.setattr(memory, "available_memory", _available(1 << 50))
    whole = fit(_cfg(folder, tmp_path / "whole", stop_after=2))
    assert whole["steps"] == 2
    ref = list(losses)
    losses.clear()

    cfg = _cfg(folder, tmp_path / "split", stop_after=2)
    mc = vitlab.load(tmp_path / "whole" / "model").config  # the run's model (its config: what the run estimates)
    kw = {"eval_batch": 1, "device_type": "cpu", "workers": 0, "num_classes": 3}
    four, eight = (memory.estimate(cfg, mc, micro=m, **kw).total for m in (4, 8))
    assert four < eight
    room = int((four + eight) / 2 / memory.MARGIN)  # 4 fits in the margin, 8 does not
    monkeypatch.setattr(memory, "available_memory", _available(room))
    capsys.readouterr()
    split = fit(cfg)
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith("memory:"))
    assert "a step of 16 images at 16 px needs" in line and "-> 4 accumulation steps of 4 images" in line
    state = load_state(tmp_path / "split" / "last.pt")
    saved = json.loads(state["sizing"])["recipe"]  # what the run chose; its config stays what was asked
    assert saved["batch_size"] == 16 and saved["accum_steps"] == 4
    assert json.loads(state["config"])["recipe"]["accum_steps"] == 1
    assert split["steps"] == 2 and len(losses) == len(ref) == 2
    np.testing.assert_allclose(losses, ref, rtol=1e-4)


def test_one_image_that_does_not_fit_is_refused_in_one_line(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", _available(1 << 20))
    out = tmp_path / "refused"
    argv = ["train", "--data", str(folder), "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    argv += ["--patch-size", "4", "--dim", "32", "--depth", "2", "--heads", "2", "--epochs", "1", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab train: error: memory: a step of 1 image at 16 px needs")
    for flag in ("--img-size", "--patch-size", "--model", "1.0 MiB available"):
        assert flag in err[0]
    assert not (out / "last.pt").exists() and not (out / ".lock").exists()


def test_the_mpp_recipe_at_224_px_would_need_tens_of_gib_and_the_estimate_sees_it() -> None:
    """The failure of the issue: the mpp recipe's patch 4 and batch 128 (made for 32 px) on 224 px photos, 3,136
    tokens an image: the estimate says tens of GiB (the kernel killed the run at 23 GB), so on this machine's
    memory it is split or refused before anything is allocated."""
    cfg = TrainConfig(recipe=get_recipe("mpp"), objective="mpp", workers=0)
    mc = ViTConfig(name="x", img_size=224, patch_size=4, embed_dim=192, depth=9, num_heads=12, mlp_dim=384)
    mc = mc.replace(num_classes=0)
    big = memory.estimate(cfg, mc, micro=128, eval_batch=1, device_type="cpu", workers=0)
    assert big.total > 20 * GiB
    small = memory.estimate(cfg, mc.replace(patch_size=32), micro=128, eval_batch=1, device_type="cpu", workers=0)
    assert small.total < big.total / 20


def _photos(root: Path, n: int = 6, side: int = 224) -> Path:
    rng = np.random.default_rng(0)
    for split, k in (("train", n), ("val", 2)):
        d = root / split / "c0"
        d.mkdir(parents=True)
        for i in range(k):
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    return root


@pytest.mark.slow
def test_mpp_on_224_px_photos_fits_its_patch_and_batch_and_stays_in_memory(tmp_path, monkeypatch, capsys):
    """``--objective mpp`` on a folder of 224-px photos: the recipe's patch 4 is replaced by the grid rule's patch,
    the batch by at most 1/16 of the data, and the planned peak is within the (stood-in) memory available."""
    photos = _photos(tmp_path / "photos")
    room = 6 * GiB
    monkeypatch.setattr(memory, "available_memory", _available(room))
    fits = []
    real = memory.memory_split

    def spy(*a, **k):
        got = real(*a, **k)
        fits.append(got)
        return got

    monkeypatch.setattr("vitlab.train.sizing.sizer.memory_split", spy)
    out = tmp_path / "mpp"
    argv = ["train", "--objective", "mpp", "--data", str(photos), "--out", str(out), "--epochs", "1"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--no-progress", "--workers", "0", "--dim", "32", "--depth", "1"]
    argv += ["--heads", "2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "mpp: patch " in text
    model = vitlab.load(out / "model")
    assert model.config.patch_size > 4 and model.config.img_size == (224, 224)
    (fitted,) = fits
    assert fitted.estimate.total <= memory.MARGIN * room
    assert fitted.recipe.batch_size <= 6


def test_mpp_on_photos_with_too_little_memory_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    photos = _photos(tmp_path / "photos")
    monkeypatch.setattr(memory, "available_memory", _available(8 << 20))
    argv = ["train", "--objective", "mpp", "--data", str(photos), "--out", str(tmp_path / "o"), "--epochs", "1"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--no-progress", "--workers", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vitlab train: error: memory: a step of 1 image at 224 px" in err[0]


def test_every_objective_adds_what_it_allocates() -> None:
    """The estimate asks the objective: the class head grows with the classes, MPP's colour head with the
    corrupted patches, distillation adds the teacher's forward pass."""
    mc = ViTConfig(name="x", img_size=64, patch_size=8, embed_dim=64, depth=2, num_heads=2, mlp_dim=128)
    kw = {"micro": 8, "eval_batch": 8, "device_type": "cpu", "workers": 0}
    cls = TrainConfig(recipe=get_recipe("auto"))
    ten = memory.estimate(cls, mc.replace(num_classes=10), num_classes=10, **kw)
    many = memory.estimate(cls, mc.replace(num_classes=20_000), num_classes=20_000, **kw)
    assert many.objective > ten.objective + 8 * 20_000 * 4 and many.states > ten.states
    mpp = memory.estimate(TrainConfig(recipe=get_recipe("mpp"), objective="mpp"), mc.replace(num_classes=0), **kw)
    assert mpp.objective > 8 * 64 * 0.5 * 512 * 4  # 512 colours on every corrupted patch
    teacher = ViTConfig(name="t", img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3, mlp_dim=768)
    taught = memory.estimate(cls, mc.replace(num_classes=10), num_classes=10, teacher=teacher, **kw)
    assert taught.objective > ten.objective + 8 * 197 * 192 * 4


def test_checkpointing_and_token_drop_and_precision_move_the_estimate() -> None:
    mc = ViTConfig(name="x", img_size=64, patch_size=4, embed_dim=64, depth=6, num_heads=2, mlp_dim=128)
    kw = {"micro": 8, "eval_batch": 1, "workers": 0, "num_classes": 0}
    base = TrainConfig(recipe=get_recipe("auto"))
    ckpt = TrainConfig(recipe=get_recipe("auto"), grad_checkpointing=True)
    gpu, gpu_ckpt = (memory.estimate(c, mc, device_type="cuda", **kw) for c in (base, ckpt))
    assert gpu_ckpt.activations < gpu.activations / 2
    cpu, cpu_ckpt = (memory.estimate(c, mc, device_type="cpu", **kw) for c in (base, ckpt))
    assert cpu_ckpt.activations >= cpu.activations  # the fused CPU blocks keep every block's buffers
    dropped = memory.estimate(TrainConfig(recipe=get_recipe("auto", token_drop=0.5)), mc, device_type="cpu", **kw)
    assert dropped.activations < 0.7 * cpu.activations
    assert gpu.activations < cpu.activations  # bf16 autocast on a GPU


def _cgroup(root: Path, proc: Path, lines: str, files: dict[str, str]) -> None:
    proc.write_text(lines)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_cgroup_limits_v1_and_v2_are_read_less_the_usage(tmp_path) -> None:
    proc = tmp_path / "cgroup"
    v2 = tmp_path / "v2"
    _cgroup(
        v2,
        proc,
        "0::/job/step\n",
        {
            "job/memory.max": str(2 * GiB),
            "job/memory.current": str(GiB),
            "job/memory.stat": f"anon 1\ninactive_file {256 << 20}\n",
            "job/step/memory.max": "max\n",
        },
    )
    assert machine.cgroup_available(proc=proc, root=v2) == [(GiB + (256 << 20), "cgroup memory.max 2.0 GiB")]
    v1 = tmp_path / "v1"
    _cgroup(
        v1,
        proc,
        "4:memory:/box\n3:cpu:/\n",
        {
            "memory/box/memory.limit_in_bytes": str(GiB),
            "memory/box/memory.usage_in_bytes": str(512 << 20),
            "memory/box/memory.stat": f"inactive_file 9\ntotal_inactive_file {128 << 20}\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",  # the root: no limit
        },
    )
    assert machine.cgroup_available(proc=proc, root=v1) == [(640 << 20, "cgroup memory.limit_in_bytes 1.0 GiB")]
    assert machine.cgroup_available(proc=tmp_path / "missing", root=v1) == []


def test_available_memory_is_the_smaller_of_meminfo_and_the_cgroup(monkeypatch) -> None:
    found = machine.available_memory(torch.device("cpu"))
    assert found is not None and found[0] > 0
    monkeypatch.setattr(machine, "cgroup_available", lambda: [(1234, "cgroup memory.max 1 KiB")])
    assert machine.available_memory(torch.device("cpu")) == (1234, "cgroup memory.max 1 KiB")


@pytest.mark.slow
def test_a_resumed_run_keeps_its_batch_and_warns(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", _available(1 << 50))
    fit(_cfg(folder, tmp_path / "r", stop_after=1))
    monkeypatch.setattr(memory, "available_memory", _available(1 << 20))
    capsys.readouterr()
    s = fit(_cfg(folder, tmp_path / "r"), resume=True)
    assert s["steps"] == 2
    assert "warning: memory: a step of 16 images" in capsys.readouterr().out
    assert json.loads(load_state(tmp_path / "r" / "last.pt")["sizing"])["recipe"]["accum_steps"] == 1


def test_the_batch_split_decision_is_the_same_on_every_rank() -> None:
    """Under torchrun every rank takes the smallest rank's memory (a collective), so all split alike; here one
    process, and ``memory_split`` refuses a batch the loaders would refuse before estimating anything."""
    cfg = TrainConfig(recipe=get_recipe("auto", batch_size=10, accum_steps=4))
    mc = ViTConfig(name="x", img_size=32, patch_size=4, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    with pytest.raises(ConfigError, match="must be a multiple of processes x --accum-steps = 4"):
        memory.memory_split(cfg, cfg.recipe, model_config=mc, dist=Dist(), device=torch.device("cpu"), num_classes=2)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
def test_the_estimate_covers_a_measured_run(tmp_path) -> None:
    """The calibration of docs/reliability.md for its smallest configuration, in a subprocess: the peak RSS the
    run adds after the estimate is at most 1.2 x the estimate (the estimate is never more than ~20 % under)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_calibration.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, str(script), "--child", "tiny 32px b128", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    r = json.loads(next(s for s in out.splitlines() if s.startswith("RESULT "))[7:])
    assert r["train"] <= 1.2 * r["train_estimate"] and r["eval"] <= 1.2 * r["eval_estimate"], r
