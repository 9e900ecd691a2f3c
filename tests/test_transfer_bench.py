"""``benchmarks/transfer.py``: the transfer protocol's splits, and its pipeline end to end on tiny data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchscripts import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "transfer.py"


def _module():
    return load("transfer")


def _names(folder: Path) -> set[str]:
    return {f"{p.parent.name}/{os.readlink(p)}" for p in folder.glob("*/*")}


def test_splits_are_disjoint_and_stratified(tmp_path: Path) -> None:
    tb = _module()
    data = tb.smoke_data(tmp_path)
    s = tb.SMOKE
    root = tmp_path / "splits"
    tb.make_splits(data, root, s, source=("src_a", "src_b"), target=("tgt_a", "tgt_b"))
    classes = {p.name for p in (root / "source/train").iterdir()}
    assert classes == {"src_a", "src_b"} and {p.name for p in (root / "target/train").iterdir()} == {"tgt_a", "tgt_b"}
    train, test = _names(root / "target/train"), _names(root / "target_eval/test")
    assert len(train) == 2 * s.target_per_class and not train & test
    dev_tr, dev_va = _names(root / "target_dev/train"), _names(root / "target_dev/val")
    assert not dev_tr & dev_va and dev_tr | dev_va == train and len(dev_va) == 2 * s.dev_val_per_class
    assert _names(root / "target_eval/train") == train
    assert all("/test/" in os.readlink(p) for p in (root / "target_eval/test").glob("*/*"))
    assert all("/train/" in os.readlink(p) for p in (root / "mpp/train").glob("*/*"))


@pytest.mark.slow
def test_smoke_runs_every_arm_and_resumes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # Each command in the script's process (--jobs 0): the same commands, without 29 interpreter starts (about 90 s of
    # the suite's two cores); `python -m vitlab` itself is the subject of the command-line tests.
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--jobs", "0", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    raw = last["raw"]["0"]
    for arm in ("scratch", "scratch_total", "sup", "sup_hires", "mpp", "scratch_default", "sup_default"):
        assert 0 <= raw[arm]["top1"] <= 100
    assert raw["scratch_total"]["steps"] > raw["scratch"]["steps"] == raw["sup"]["steps"] == raw["mpp"]["steps"]
    assert set(raw["fewshot_random"]) == {"1", "2"}
    assert raw["grid/sup/adamw:1e-3"]["top1"] == raw["sup"]["top1"]  # the one grid point is the chosen arm
    commands = (tmp_path / "commands.sh").read_text().splitlines()
    assert any(" finetune --init " in c and "--img-size 12" in c for c in commands)  # the 1.5x fine-tune
    assert any(" train --objective mpp " in c for c in commands)
    defaults = [c for c in commands if "/sup_default " in c]  # the plain command a user would type: no recipe flags
    assert len(defaults) == 1 and " --lr " not in defaults[0] and " --recipe " not in defaults[0]
    assert "| few-shot linear" in (tmp_path / "results.md").read_text()
    chosen = json.loads((tmp_path / "dev" / "sup.json").read_text())
    assert chosen["chosen"] in chosen["scores"]
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)  # every step done: nothing runs
    assert again.returncode == 0 and "$ " not in again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1])["raw"] == last["raw"]
