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

from benchscripts import load

ROOT = Path(__file__).resolve().parents[1]


def _speedrun():
    """benchmarks/speedrun.py as a module: the script, its records (``speedrun_records.json``) and its levers
    (``speedrun_levers.json``) as it reads them."""
    return load("speedrun")


VIT_LEVERS = "seq-pool,muon,whiten,tta-flip,mpp=0.5"
VIT_FLAGS = ["--pool", "seq", "--optimizer", "muon", "--whiten-init", "--tta", "flip", "--mpp-warmup", "0.5"]
HYBRID_FLAGS = ["--model", "vit_cct7_3x2", "--patch-size", "1", "--whiten-init"]


@pytest.mark.slow
@pytest.mark.parametrize("track, levers", [("vit", VIT_LEVERS), ("hybrid", "cct,whiten")])
def test_smoke_run_ends_with_one_json_line(track: str, levers: str) -> None:
    """A run is the track's current record (its flags after the recipe's), the named levers after it: every lever
    of its track trains end to end."""
    sr = _speedrun()
    record = list(sr.current(track).flags)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--smoke", "--track", track, "--levers", levers]
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
    assert ("--norm-stats inception" in row["command"]) == (track == "hybrid")  # the vit track: the data's
    assert row["levers"] == {} and row["record"] == record and row["hardware_verified"] is True
    assert row["named_levers"] == levers.split(",")
    flags = VIT_FLAGS if track == "vit" else HYBRID_FLAGS
    assert row["command"].endswith(shlex.join(["--no-progress", *record, *flags]))
    assert row["reproduce"] == (
        f"python benchmarks/speedrun.py --track {track} --minutes 0.1 --smoke --seed 0 --from record --levers {levers}"
    )
    summary = sorted(Path(tempfile.gettempdir()).glob("speedrun-*"))  # the temporary run folder is gone
    assert not any(str(x) in row["command"] for x in summary)


@pytest.mark.slow
def test_real_runs_need_data() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--track", "vit"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--data DIR is required" in proc.stderr


def test_minutes_to_target_is_the_first_epoch_that_reached_it() -> None:
    minutes_to = _speedrun().minutes_to
    rows = [{"top1": 0.5, "wall_s": 60}, {"top1": 0.61, "wall_s": 120}, {"top1": 0.59, "wall_s": 180}]
    rows.append({"top1": 0.72, "wall_s": 240})
    assert minutes_to(rows) == {"60": 2.0, "70": 4.0, "80": None}
    assert minutes_to(rows[:3]) == {"60": 2.0, "70": None, "80": None}


def _args(**kw) -> argparse.Namespace:
    base = {"track": "vit", "smoke": False, "minutes": 20.0, "seed": 0, "device": "cpu", "compile": True}
    base |= {
        "threads": 0,
        "start": "record",
        "levers": None,
        "token_drop": None,
        "token_drop_until": None,
        "res_schedule": None,
    }
    return argparse.Namespace(**(base | {"train_args": None} | kw))


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
    again = sr.reproduce(_args(start="recipe", token_drop=0.5, train_args="--pool cls", data="D", compile=False))
    assert again == (
        "python benchmarks/speedrun.py --track vit --minutes 20 --data D --seed 0 --from recipe --token-drop 0.5 "
        "--train-args '--pool cls' --no-compile"
    )


def test_a_model_in_train_args_replaces_the_tracks_model_and_shape(tmp_path) -> None:
    """The recipe's width and depth do not override a vit_cct name's own shape; those given in --train-args do, and
    the run's model is then named by its stem."""
    from vitlab.cli import build_parser
    from vitlab.train.conf.arch import fresh_config
    from vitlab.train.conf.parser import config_from_args

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
    c = model(track="hybrid", levers="cct")  # the lever: the tokenizer alone, in the recipe's shape
    assert (c.name, c.embed_dim, c.depth, c.pool, c.posemb, c.stem, c.hybrid_layers) == (
        "vit_cct_3x2_p1_d128_l6",
        128,
        6,
        "gap",
        "sincos2d",
        "conv",
        None,
    )
    c = model(track="vit", train_args="--model vit_cct7_3x1 --dim 128 --depth 6 --heads 4")
    assert (c.name, c.embed_dim, c.depth, c.stem, c.patch_size) == ("vit_cct_3x1_p1_d128_l6", 128, 6, "conv", 1)
    c = model(track="vit", train_args="--pool seq")
    assert (c.name, c.pool, c.class_token, c.patch_size) == ("vit_p4_d128_l6", "seq", False, 4)


def test_the_records_table_holds_the_measured_records_and_the_page_mirrors_it() -> None:
    """docs/speedrun.md holds the records and levers tables speedrun.py writes from speedrun_records.json and
    speedrun_levers.json, verbatim: the table the default recipe comes from and the page cannot disagree."""
    sr = rec = lev = _speedrun()
    assert set(sr.TRACKS) == set(sr.ARCH) == set(sr.INPUTS) == {"vit", "hybrid"}
    assert sr.current("vit").top1 == 76.80 and sr.current("vit").machine == "AMD EPYC"
    vit_flags = ("--token-drop", "0.5", *RS, "--optimizer", "muon", "--tta", "flip-last", "--whiten-init")
    assert sr.current("vit").flags == vit_flags
    assert sr.current("hybrid").top1 == 78.87 and sr.current("hybrid").machine == "AMD EPYC"
    assert sr.current("hybrid").flags == ("--token-drop", "0.5", "--tta", "flip-last", "--optimizer", "muon")
    (longest,) = [r for r in rec.RECORDS if r.minutes == 40]
    assert (longest.track, longest.runs, longest.verified) == ("hybrid", (77.43,), False)
    for r in rec.RECORDS:  # each command ran the record's flags: --track T --minutes M --data D FLAGS --seed S
        words = shlex.split(r.command)
        assert words[2:6] == ["--track", r.track, "--minutes", f"{r.minutes:g}"] and words[-2:] == ["--seed", "S"]
        assert words[8:10] == ["--from", "recipe"]  # so that it reproduces its row whatever the current record
        given = words[10:-2]
        if "--levers" in given:  # the named levers' flags
            at = given.index("--levers")
            given = given[:at] + lev.lever_flags(r.track, given[at + 1]) + given[at + 2 :]
        assert sorted(rec._pairs(tuple(given))) == sorted(rec._pairs(r.flags)), r.command
    assert rec.adds(sr.current("vit")) == ("--whiten-init",)
    for track in sr.TRACKS:  # a record enters by beating the one before it, on the same machine
        held = [r for r in rec.RECORDS if (r.track, r.minutes, r.verified) == (track, rec.RECORD_MINUTES, True)]
        assert rec.beaten(held[0]) == () and sr.current(track) is held[-1]
        for r in held[1:]:
            beat = rec.beaten(r)
            assert r.machine in rec.MACHINES and len(beat) >= 2 and r.top1 >= sum(beat) / len(beat) + 0.1, r
    page = (ROOT / "docs" / "speedrun.md").read_text()
    assert sr.records_markdown() in page, "docs/speedrun.md: paste `python benchmarks/speedrun.py --records`"
    assert sr.levers_markdown() in page, "docs/speedrun.md: paste `python benchmarks/speedrun.py --records`"
    assert "has not been verified on hardware" in sr.GPU_NOTE


RS = ("--res-schedule", "24:0.5,32:1.0")


def _copy_of_the_script(tmp_path: Path) -> Path:
    """speedrun.py, its shared helper and its two data files in a folder of their own."""
    import shutil

    for name in ("speedrun.py", "_common.py", "speedrun_records.json", "speedrun_levers.json"):
        shutil.copy(ROOT / "benchmarks" / name, tmp_path / name)
    return tmp_path


def test_the_records_and_levers_are_data_files_the_tables_are_made_from(tmp_path) -> None:
    """The records and the levers are JSON data read by speedrun.py, not Python tables: a record added to
    speedrun_records.json becomes the track's current record (its flags the default run's) and a row of the page's
    table, and a lever's result edited in speedrun_levers.json is what the levers table says."""
    folder = _copy_of_the_script(tmp_path)
    records = json.loads((folder / "speedrun_records.json").read_text())
    best = [r for r in records["records"] if r["track"] == "vit" and r["minutes"] == 20][-1]
    newer = {**best, "flags": [*best["flags"], "--ema", "0.999"], "runs": [77.5, 77.7], "commits": "abc1234"}
    records["records"].append(newer)
    (folder / "speedrun_records.json").write_text(json.dumps(records))
    levers = json.loads((folder / "speedrun_levers.json").read_text())
    levers["levers"]["ema"]["measured"]["vit"] = "won, all of it"
    (folder / "speedrun_levers.json").write_text(json.dumps(levers))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(folder / "speedrun.py"), "--records"], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Current record: **77.60%** in 20 minutes" in proc.stdout
    assert "| 20 min | **77.60%** | 77.50 / 77.70 |" in proc.stdout and "`--ema 0.999` |" in proc.stdout
    assert "vit: won, all of it<br>hybrid: lost, -1.05" in proc.stdout
    sr = _speedrun()
    assert "**77.60%**" not in sr.records_markdown()  # the repository's files are untouched
    assert json.loads((ROOT / "benchmarks" / "speedrun_records.json").read_text())["records"][-1]["track"] == "hybrid"


@pytest.mark.parametrize(
    ("text", "says"),
    [("[1, 2]", "not a JSON object"), ("{", "not JSON"), ('{"data": "d"}', "'tracks'")],
)
def test_a_broken_records_file_is_one_line_naming_it(tmp_path, text: str, says: str) -> None:
    folder = _copy_of_the_script(tmp_path)
    (folder / "speedrun_records.json").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(folder / "speedrun.py"), "--records"], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("speedrun: ") and says in proc.stderr, proc.stderr
    assert "speedrun_records.json" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_named_levers_apply_where_they_can_and_each_command_is_a_valid_run(tmp_path) -> None:
    from vitlab.cli import build_parser
    from vitlab.train.conf.parser import config_from_args
    from vitlab.train.conf.rules import validate

    sr = lev = _speedrun()
    assert lev.lever_flags("vit", "seq-pool, muon,mpp=0.25,ema") == [
        "--pool",
        "seq",
        "--optimizer",
        "muon",
        "--mpp-warmup",
        "0.25",
        "--ema",
        "0.998",
    ]
    assert lev.lever_flags("hybrid", "ema=0.99") == ["--ema", "0.99"]
    for spec, why in (
        ("nope", "no lever 'nope'"),
        ("cct", "does not apply to the vit track"),
        ("muon=2", "muon takes no value"),
        ("tta-flip,tta-flip-last", "two values of --tta"),
    ):
        with pytest.raises(ValueError, match=why):
            lev.lever_flags("vit", spec)
    with pytest.raises(ValueError, match="needs cct"):
        lev.lever_flags("hybrid", "whiten")
    with pytest.raises(ValueError, match="does not apply to the hybrid track"):
        lev.lever_flags("hybrid", "mpp")
    for name, lever in lev.LEVERS.items():
        for track in lever.tracks:
            spec = "cct,whiten" if (name, track) == ("whiten", "hybrid") else name
            cmd = sr.train_command(_args(track=track, levers=spec), str(tmp_path), "out")
            assert cmd[-len(lever.flags) :] == list(lever.flags)
            validate(config_from_args(build_parser().parse_args(cmd)))  # vitlab train would start it
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speedrun.py"), "--track", "vit", "--smoke", "--levers", "cct"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "cct does not apply to the vit track" in proc.stderr


@pytest.mark.slow
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
    return load("speedrun_ab")


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


@pytest.mark.slow
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
