"""Config files: ``vitlab train --config FILE`` (YAML or JSON) under the flags given, and the ``config.yaml`` every run
writes, which re-creates the run. Errors from a file name the file and the key; from the command line, the flag."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.train.conf.config_file import MAX_BYTES, read_config_file
from vitlab.train.conf.train_config import build_config

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("cfgdata") / "data", per_class=8, size=16)


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.slow
def test_a_run_is_recreated_from_its_config_yaml(folder, tmp_path, step_losses, capsys) -> None:
    """The run's config.yaml holds what it was asked (the data's absolute path, the recipe's name and the fields
    given, nothing about the process), its sizing.json what it chose (the auto recipe as fitted and the line that
    says so); a run from the config.yaml reads those choices back: the same configuration and, on one process, the
    same first steps."""
    losses = step_losses
    x, y = tmp_path / "x", tmp_path / "y"
    common = ["--cache-dir", str(tmp_path / "cache"), "--no-progress", "--workers", "0", "--stop-after", "2"]
    assert main(["train", "--data", os.path.relpath(folder), "--out", str(x), "--epochs", "2", *TINY, *common]) == 0
    first = list(losses)
    saved = yaml.safe_load((x / "config.yaml").read_text())
    assert saved["data"] == str(folder.resolve()) and saved["recipe"] == {"name": "auto", "epochs": 2}
    assert not {"out", "workers", "progress", "stop_after", "memory_budget", "allow_pipe", "resolved"} & set(saved)
    chosen = json.loads((x / "sizing.json").read_text())["sizing"]
    assert chosen["chosen"].startswith("auto: ") and chosen["recipe"]["batch_size"] == 8
    losses.clear()
    capsys.readouterr()
    assert main(["train", "--config", str(x / "config.yaml"), "--out", str(y), *common]) == 0
    out = capsys.readouterr().out
    assert f"(replayed from {x / 'sizing.json'}; --replan to measure afresh)" in out  # read back, not a new fit
    assert "images: training at 16x16 px; stored with the shorter side at most 32 px; crop_pct 1 (as chosen" in out
    assert "" not in out.splitlines()  # (its storage's line was printed empty)
    assert (y / "config.yaml").read_text() == (x / "config.yaml").read_text()
    assert len(first) == 2 and losses == first


@pytest.mark.slow
def test_a_time_budget_run_is_replayed_with_its_plan_and_its_replans(folder, tmp_path, step_losses, capsys) -> None:
    """A time-budgeted run's plan is measured (its pace, then the re-plans the budget made); a run from its
    config.yaml makes the same plan and the same moves at the same steps without measuring, so the same steps and,
    on one process, the same losses, whatever the machine's pace (before: the recipe was read back but the plan
    measured afresh: 212 steps against the original's 163 on the clothing photos)."""
    x, y = tmp_path / "x", tmp_path / "y"
    common = ["--cache-dir", str(tmp_path / "cache"), "--no-progress", "--workers", "0"]
    assert main(["train", "--data", str(folder), "--out", str(x), "--time-budget", "4s", *TINY, *common]) == 0
    first = list(step_losses)
    planned = json.loads((x / "sizing.json").read_text())
    step_losses.clear()
    capsys.readouterr()
    assert main(["train", "--config", str(x / "config.yaml"), "--out", str(y), *common]) == 0
    out = capsys.readouterr().out
    assert "replayed from" in out and "" not in out.splitlines()  # (its re-plan lines began with a blank one)
    again = json.loads((y / "sizing.json").read_text())
    assert again["sizing"]["plan"] == planned["sizing"]["plan"] and again["replans"] == planned["replans"]
    steps = [json.loads((run / "summary.json").read_text())["steps"] for run in (x, y)]
    assert steps[0] == steps[1]
    assert step_losses == first


def test_yaml_and_json_say_the_same_and_flags_win(folder, tmp_path) -> None:
    doc = {"data": str(folder), "seed": 3, "recipe": {"name": "small-data", "lr": "2e-3", "crop_scale": [0.5, 1]}}
    doc["arch"] = {"embed_dim": 32, "pool": "gap"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "c.json").write_text(json.dumps(doc))
    a, b = read_config_file(tmp_path / "c.yaml"), read_config_file(tmp_path / "c.json")
    assert a == b and a["recipe.lr"] == 0.002 and a["recipe.crop_scale"] == (0.5, 1.0)
    cfg = build_config(a, given=set(a))
    assert cfg.recipe.name == "small-data" and cfg.recipe.lr == 0.002 and cfg.seed == 3
    assert cfg.arch == {"embed_dim": 32, "pool": "gap", "class_token": False} and cfg.recipe_given == [
        "crop_scale",
        "lr",
    ]
    from vitlab.train.conf.config_file import merge

    values, given, _ = merge({"recipe.lr": 0.5, "seed": 0}, {"recipe.lr"}, a, path="c.yaml")
    cfg = build_config(values, given=given)
    assert cfg.recipe.lr == 0.5 and cfg.seed == 3  # the flag given wins; the default does not


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("recipe:\n  lrr: 0.1\n", "recipe.lrr: unknown key; did you mean recipe.lr?"),
        ("lr: 0.1\n", "lr: unknown key; did you mean recipe.lr?"),
        ("recipe:\n  epochs: many\n", "recipe.epochs: expected an integer"),
        ("recipe:\n  lr: 0\n", "recipe.lr: must be positive"),
        ("keep: worst\n", "keep: expected one of best, last"),
        ("allow_pipe: true\n", "allow_pipe: not read from a config file; give --allow-pipe on the command line"),
        ("a: &x [1]\nb: *x\n", "anchors and aliases"),
        ("recipe:\n  epochs: 2\n  lr: 0.1\n  epochs: 3\n", "epochs is set twice in one mapping (lines 2 and 4)"),
        ("- data\n", "expected a mapping of options"),
    ],
)
def test_an_error_from_a_config_file_names_the_file_and_the_key(tmp_path, capsys, text, says) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    argv = ["train", "--config", str(path), "--data", str(tmp_path / "none"), "--out", str(tmp_path / "r")]
    err = _one_line_error(capsys, argv)
    assert err.startswith(f"vitlab train: error: {path}: ") and says in err, err
    assert not (tmp_path / "r").exists()


def test_an_error_from_the_command_line_names_the_flag(tmp_path, capsys) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("recipe:\n  lr: 0.01\n")
    argv = ["train", "--config", str(path), "--lr", "0", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "r")]
    err = _one_line_error(capsys, argv)
    assert "error: --lr: must be positive" in err and str(path) not in err


def test_a_key_set_twice_is_refused_in_json_too(tmp_path) -> None:
    """json, like PyYAML, keeps the last of two values silently; which one a run used would be a guess."""
    path = tmp_path / "c.json"
    path.write_text('{"recipe": {"epochs": 2, "epochs": 3}}')
    with pytest.raises(ConfigError, match="epochs is set twice in one mapping"):
        read_config_file(path)
    path.write_text('{"recipe": {"epochs": 2}, "arch": {"depth": 2}}')
    assert read_config_file(path)["recipe.epochs"] == 2


def test_a_config_file_is_read_within_bounds(tmp_path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match="more than a config file's"):
        read_config_file(big)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_config_file(tmp_path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 50 + "]" * 50)
    with pytest.raises(ConfigError, match="nested deeper"):
        read_config_file(deep)
    (tmp_path / "empty.yaml").write_text("")
    assert read_config_file(tmp_path / "empty.yaml") == {}


def test_config_with_resume_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")
    err = _one_line_error(capsys, ["train", "--config", str(path), "--out", str(tmp_path / "r"), "--resume"])
    assert "--config with --resume" in err
