"""``benchmarks/posemb_ablation.py``: 2 variants x 2 steps on a tiny folder write a well-formed table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchscripts import load
from imagefolder import tiny_folder


@pytest.fixture(scope="module")
def ablation():
    return load("posemb_ablation")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("abl") / "rgb", per_class=8, test_per_class=3)


@pytest.mark.slow
def test_two_variants_two_steps_write_a_table(ablation, data_dir, tmp_path):
    out = tmp_path / "docs" / "table.md"
    args = [
        "--data",
        str(data_dir),
        "--out",
        str(out),
        "--runs",
        str(tmp_path / "runs"),
        "--variants",
        "learn,none",
        "--steps",
        "2",
    ]
    args += [
        "--train-per-class",
        "0",
        "--test-per-class",
        "0",
        "--batch-size",
        "12",
        "--dim",
        "16",
        "--depth",
        "1",
        "--heads",
        "2",
    ]
    assert ablation.main([*args, "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0

    lines = out.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| variant |"))
    assert "Table 8" in lines[0] and "2 optimizer steps per variant (fixed)" in lines[0] and "Load average" in lines[1]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[header:]]
    assert cells[0] == ["variant", "position embedding / pooling", "params", "steps", "test top-1", "wall (s)", "load"]
    assert set(cells[1]) <= {"---", "---:"} and len(cells[1]) == 7
    body = cells[2:]
    assert [r[0] for r in body] == ["learn", "none"] and all(len(r) == 7 for r in body)
    params = [int(r[2].replace(",", "")) for r in body]
    assert params[0] - params[1] == (1 + 4) * 16  # the learned table: class token + 2x2 patches, width 16
    assert [r[3] for r in body] == ["2", "2"]
    for r in body:
        assert r[4].endswith("%") and 0 <= float(r[4][:-1]) <= 100

    raw = json.loads(out.with_suffix(".json").read_text())
    assert [r["variant"] for r in raw["rows"]] == ["learn", "none"] and raw["rows"][0]["posemb"] == "learn"
    assert all(r["steps"] == 2 and 0 <= r["top1"] <= 1 for r in raw["rows"])


def test_subset_folder_links_the_first_files_of_each_class(ablation, data_dir, tmp_path):
    sub = Path(ablation.subset_folder(str(data_dir), tmp_path / "sub", train_per_class=5, test_per_class=2))
    assert sorted(p.name for p in (sub / "train" / "class1").iterdir()) == [f"{i:02d}.png" for i in range(5)]
    assert len(list((sub / "test" / "class2").iterdir())) == 2
    assert (sub / "train" / "class0" / "00.png").resolve() == (data_dir / "train" / "class0" / "00.png").resolve()
    assert ablation.subset_folder("digits", tmp_path / "x", train_per_class=5, test_per_class=2) == "digits"


def test_unknown_variant_is_a_usage_error(ablation, capsys):
    with pytest.raises(SystemExit) as e:
        ablation.main(["--variants", "learn,rope"])
    assert e.value.code == 2 and "rope" in capsys.readouterr().err
