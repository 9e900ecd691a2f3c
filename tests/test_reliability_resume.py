"""``--resume`` respects what the user said: a changed flag the run cannot honour is refused in one line
listing every difference, a change it can honour (``--epochs``) is applied and reported, and data that
changed since the run started is refused with the list of what changed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.train.persist.state import load_state

pytestmark = pytest.mark.slow  # end to end: every test here trains, stops and resumes runs

ARCH = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4"]


def train(data, out, *extra: str) -> list[str]:
    """A tiny run: 48 training images, batch 16, so 3 steps per epoch."""
    return [
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--cache-dir",
        str(out.parent / "cache"),
        "--recipe",
        "digits",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        *ARCH,
        "--workers",
        "0",
        "--no-progress",
        *extra,
    ]


def resume(out, *extra: str) -> list[str]:
    return ["train", "--out", str(out), "--resume", "--workers", "0", "--no-progress", *extra]


@pytest.fixture
def stopped_run(tmp_path, capsys):
    """A run stopped after its first epoch (step 3 of 6), on its own copy of the data."""
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "run"
    assert main(train(data, out, "--stop-after", "3")) == 0
    assert load_state(out / "last.pt")["step"] == 3
    capsys.readouterr()
    return data, out


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_changed_architecture_and_batch_are_refused_listing_every_difference(stopped_run, capsys):
    data, out = stopped_run
    assert main(resume(out, "--dim", "32", "--heads", "2")) == 2  # --heads unchanged: not listed
    err = one_error_line(capsys)
    assert "--dim 16 -> 32" in err and "--heads" not in err and "cannot change" in err, err

    assert main(resume(out, "--batch-size", "8", "--lr", "0.01", "--depth", "2")) == 2
    err = one_error_line(capsys)
    for diff in ("--depth 1 -> 2", "--batch-size 16 -> 8", "--lr 0.003 -> 0.01"):
        assert diff in err, err
    assert main(resume(out, "--data", str(data.parent))) == 2
    assert f"--data {data} -> {data.parent}" in one_error_line(capsys)
    assert load_state(out / "last.pt")["step"] == 3  # nothing was touched

    # The same values as the saved run (given again, or the recipe's own) are no change.
    assert main(resume(out, "--dim", "16", "--batch-size", "16", "--recipe", "digits", "--data", str(data))) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 6


def test_epochs_extension_is_applied_reported_and_the_run_continues(stopped_run, capsys):
    _, out = stopped_run
    assert main(resume(out, "--epochs", "4", "--save-every", "5")) == 0
    stdout = capsys.readouterr().out
    line = next(x for x in stdout.splitlines() if x.startswith("--resume: applied"))
    assert "--epochs 2 -> 4" in line and "--save-every none -> 5" in line and "step 12" in line, line
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["epochs"], summary["steps"], summary["interrupted"]) == (4, 12, False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    state = load_state(out / "last.pt")
    assert state["plan"]["epochs"] == 4 and state["scheduler"]["lr_lambdas"][0]["total_steps"] == 12
    assert json.loads(state["config"])["save_every"] == 5

    # A finished run extended again; then shortened below where it is: it finishes at once, saying so.
    assert main(resume(out, "--epochs", "5")) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 15
    capsys.readouterr()
    assert main(resume(out, "--epochs", "3")) == 0
    stdout = capsys.readouterr().out
    assert "--epochs 5 -> 3 (5 epoch(s) already done: the run finishes now)" in stdout, stdout
    assert load_state(out / "last.pt")["step"] == 15


def test_images_deleted_since_the_run_started_are_refused(stopped_run, capsys):
    """Before: fewer steps per epoch, and the resumed run declared itself complete early."""
    data, out = stopped_run
    for p in sorted((data / "train" / "class1").iterdir())[:12]:
        p.unlink()
    assert main(resume(out)) == 2
    err = one_error_line(capsys)
    assert "the data changed since the run started" in err and "12 file(s) removed from train" in err, err
    assert load_state(out / "last.pt")["step"] == 3


def test_a_class_added_is_refused_in_one_line(stopped_run, capsys):
    """Before: a size-mismatch traceback while loading the saved head."""
    data, out = stopped_run
    for split in ("train", "test"):
        shutil.copytree(data / split / "class0", data / split / "zebra")
    assert main(resume(out)) == 2
    err = one_error_line(capsys)
    assert "class 'zebra' added" in err and "16 file(s) added to train" in err and "4 file(s) added to test" in err


def test_a_modified_image_is_refused(stopped_run, capsys):
    data, out = stopped_run
    img = data / "train" / "class2" / "00.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(img)
    assert main(resume(out)) == 2
    assert "files in train renamed, replaced or modified (48 files either way)" in one_error_line(capsys)


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_note(stopped_run, capsys):
    import torch

    _, out = stopped_run
    state = load_state(out / "last.pt")
    del state["data_fingerprint"]
    torch.save(state, out / "last.pt")
    assert main(resume(out)) == 0
    assert "predates data fingerprints" in capsys.readouterr().out
    assert json.loads(load_state(out / "last.pt")["data_fingerprint"])["splits"]["train"]["files"] == 48
