"""``benchmarks/speedrun.py --smoke``: the time-to-accuracy script's pipeline on tiny generated data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("track, extra", [("vit", ["--token-drop", "0.5"]), ("hybrid", [])])
def test_smoke_run_ends_with_one_json_line(track: str, extra: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--smoke", "--track", track, *extra]
    # a few seconds on a quiet machine; the generous timeout is for a loaded one
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"track", "minutes", "top1", "steps", "images_per_sec", "command", "minutes_to"} <= set(row)
    assert set(row["minutes_to"]) == {"60", "70"} and len(row["epoch_top1"]) >= 1
    assert row["track"] == track and row["minutes"] == 0.1 and row["steps"] > 0 and 0 <= row["top1"] <= 1
    assert row["command"].startswith("vitlab train ") and "--time-budget 6s" in row["command"]
    assert ("--patch-size 4" in row["command"]) == (track == "vit")
    assert ("--model vit_r_ti16" in row["command"]) == (track == "hybrid")
    assert ("--norm-stats inception" in row["command"]) == (track == "hybrid")  # the vit track: the data's
    assert row["levers"] == ({"--token-drop": 0.5} if extra else {})
    assert ("--token-drop 0.5" in row["command"]) == bool(extra)


def test_real_runs_need_data() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--track", "vit"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--data DIR is required" in proc.stderr


def test_minutes_to_target_is_the_first_epoch_that_reached_it() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from speedrun import minutes_to
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = [{"top1": 0.5, "wall_s": 60}, {"top1": 0.61, "wall_s": 120}, {"top1": 0.59, "wall_s": 180}]
    rows.append({"top1": 0.72, "wall_s": 240})
    assert minutes_to(rows) == {"60": 2.0, "70": 4.0}
    assert minutes_to(rows[:3]) == {"60": 2.0, "70": None}


def test_train_args_come_last_so_that_they_override_the_recipe() -> None:
    import argparse

    from vitlab.cli import build_parser

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from speedrun import levers, train_command
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    given = "--pool cls --dim 192 --depth 3 --heads 6"
    kw = {"track": "vit", "smoke": False, "minutes": 20.0, "seed": 0, "device": "cpu", "compile": True, "threads": 0}
    args = argparse.Namespace(
        **kw, token_drop=0.5, token_drop_until=None, res_schedule=None, ema=None, train_args=given
    )
    cmd = train_command(args, "data", "out")
    assert cmd[-8:] == given.split() and cmd.count("--pool") == 2
    assert levers(args) == {"--token-drop": 0.5, "train_args": given}
    parsed = build_parser().parse_args(cmd)
    assert (parsed.pool, parsed.dim, parsed.depth, parsed.heads) == ("cls", 192, 3, 6)
    assert (
        levers(argparse.Namespace(token_drop=None, token_drop_until=None, res_schedule=None, ema=None, train_args=""))
        == {}
    )


def test_timm_baseline_smoke_run() -> None:
    pytest.importorskip("timm")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--smoke", "--track", "vit", "--baseline", "timm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["baseline"] == "timm" and row["steps"] > 0 and 0 <= row["top1"] <= 1
    assert row["command"].startswith("python benchmarks/speedrun.py ") and "--baseline timm" in row["command"]


def _ab():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import speedrun_ab
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return speedrun_ab


def test_ab_models_are_one_architecture_and_the_timm_init_is_timms() -> None:
    pytest.importorskip("timm")
    ab = _ab()
    kw = {"fc_norm": True, "img": 32, "classes": 10, "smoke": False}
    theirs = ab.build("timm", init="native", **kw).state_dict()
    ours = ab.build("vitlab", init="timm", **kw)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.items()}
    fc1 = ours.blocks[0].mlp.fc1.weight
    assert 0.018 < fc1.std().item() < 0.022  # N(0, 0.02) truncated at +-2 (not 2 std), as timm
    native = ab.build("vitlab", init="native", **kw).blocks[0].mlp.fc1.weight
    assert native.std().item() > 0.05  # the JAX init's Xavier-uniform: about 0.072 for 128 -> 256


@pytest.mark.parametrize("extra", [["--model", "timm", "--pipeline", "torchvision", "--decay", "all"], []])
def test_ab_smoke_run_ends_with_one_json_line(extra: list[str]) -> None:
    if extra:
        pytest.importorskip("timm")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun_ab.py"), "--smoke", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["steps"] == 4 and 0 <= row["top1"] <= 1 and row["norm"] == "data"
    assert row["model"] == ("timm" if extra else "vitlab")
