"""``benchmarks/speedrun.py --smoke``: the time-to-accuracy script's pipeline on tiny generated data."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _speedrun():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import speedrun
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return speedrun


@pytest.mark.parametrize(
    "track, extra",
    [("vit", []), ("vit", ["--from", "recipe", "--token-drop", "0.5"]), ("hybrid", []), ("cct", [])],
)
def test_smoke_run_ends_with_one_json_line(track: str, extra: list[str]) -> None:
    """Without a lever flag a run is the track's current record (its flags after the recipe's)."""
    record = list(_speedrun().RECORDS[track].flags)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--smoke", "--track", track, *extra]
    # a few seconds on a quiet machine; the generous timeout is for a loaded one
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"track", "minutes", "top1", "steps", "images_per_sec", "command", "minutes_to", "record"} <= set(row)
    assert set(row["minutes_to"]) == {"60", "70", "80"} and len(row["epoch_top1"]) >= 1
    assert row["track"] == track and row["minutes"] == 0.1 and row["steps"] > 0 and 0 <= row["top1"] <= 1
    assert row["command"].startswith("vitlab train ") and "--time-budget 6s" in row["command"]
    assert ("--patch-size 4" in row["command"]) == (track == "vit")
    assert ("--model vit_r_ti16" in row["command"]) == (track == "hybrid")
    assert ("--model vit_cct7_3x2" in row["command"]) == (track == "cct")
    assert ("--dim 128" in row["command"]) == (track != "cct")  # a vit_cct name keeps its own shape
    assert ("--norm-stats inception" in row["command"]) == (track == "hybrid")  # the others: the data's
    assert row["levers"] == ({"--token-drop": 0.5} if extra else {})
    assert row["record"] == (None if extra else record) and row["hardware_verified"] is True
    if not extra:
        assert row["command"].endswith(shlex.join(["--no-progress", *record]))
    summary = sorted(Path(tempfile.gettempdir()).glob("speedrun-*"))  # the temporary run folder is gone
    assert not any(str(x) in row["command"] for x in summary)


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
    assert minutes_to(rows) == {"60": 2.0, "70": 4.0, "80": None}
    assert minutes_to(rows[:3]) == {"60": 2.0, "70": None, "80": None}


def _args(**kw) -> argparse.Namespace:
    base = {"track": "vit", "smoke": False, "minutes": 20.0, "seed": 0, "device": "cpu", "compile": True}
    base |= {"threads": 0, "start": "record", "token_drop": None, "token_drop_until": None, "res_schedule": None}
    return argparse.Namespace(**(base | {"ema": None, "train_args": None} | kw))


def test_train_args_come_last_so_that_they_override_the_recipe_and_the_record() -> None:
    from vitlab.cli import build_parser

    sr = _speedrun()
    given = "--pool cls --dim 192 --depth 3 --heads 6"
    args = _args(token_drop=0.3, train_args=given)
    cmd = sr.train_command(args, "data", "out")
    assert cmd[-8:] == given.split() and cmd.count("--pool") == 2
    assert cmd[-10:-8] == ["--token-drop", "0.3"] and cmd.count("--token-drop") == 2  # after the record's 0.5
    assert sr.levers(args) == {"--token-drop": 0.3, "train_args": given}
    parsed = build_parser().parse_args(cmd)
    assert (parsed.pool, parsed.dim, parsed.depth, parsed.heads, parsed.token_drop) == ("cls", 192, 3, 6, 0.3)
    assert parsed.res_schedule == "24:0.5,32:1.0"  # the record's, not overridden
    assert sr.levers(_args(train_args="")) == {}
    bare = build_parser().parse_args(sr.train_command(_args(start="recipe"), "data", "out"))
    assert (bare.token_drop, bare.res_schedule) == (None, None)


def test_a_model_in_train_args_replaces_the_tracks_model_and_shape(tmp_path) -> None:
    """The recipe's width and depth do not override a vit_cct name's own shape; those given in --train-args do, and
    the run's model is then named by its stem."""
    from vitlab.cli import build_parser
    from vitlab.train.spec.arch import fresh_config
    from vitlab.train.spec.parser import config_from_args

    sr = _speedrun()

    def model(**kw):
        cfg = config_from_args(build_parser().parse_args(sr.train_command(_args(**kw), str(tmp_path), "out")))
        return fresh_config(cfg, image_size=32, in_chans=3, num_classes=10, class_names=list("abcdefghij"))

    c = model(track="hybrid", train_args="--model vit_cct7_3x2")
    assert (c.name, c.embed_dim, c.depth, c.pool, c.posemb, c.stem_layers) == (
        "vit_cct7_3x2",
        256,
        7,
        "seq",
        "learn",
        2,
    )
    assert c.mean == (0.5, 0.5, 0.5)  # the hybrid track's inputs stay
    c = model(track="cct")
    assert (c.name, c.embed_dim, c.depth) == ("vit_cct7_3x2", 256, 7)
    c = model(track="vit", train_args="--model vit_cct7_3x1 --dim 128 --depth 6 --heads 4")
    assert (c.name, c.embed_dim, c.depth, c.stem, c.patch_size) == ("vit_cct_3x1_p1_d128_l6", 128, 6, "conv", 1)
    c = model(track="vit", train_args="--pool seq")
    assert (c.name, c.pool, c.class_token, c.patch_size) == ("vit_p4_d128_l6", "seq", False, 4)


def test_every_track_has_a_record_and_the_gpu_track_says_it_is_unverified() -> None:
    sr = _speedrun()
    assert set(sr.RECORDS) == set(sr.ARCH) == {"vit", "hybrid", "cct"}
    assert sr.RECORDS["vit"].top1 == 71.48 and sr.RECORDS["hybrid"].top1 == 74.59
    assert sr.RECORDS["cct"].top1 is None and sr.RECORDS["cct"].flags == ()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--track", "vit", "--device", "cuda"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)  # refused for want of --data first
    assert proc.returncode == 2
    assert "has not been verified on hardware" in sr.GPU_NOTE


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
