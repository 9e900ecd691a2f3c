"""The command line end to end on a tiny ImageFolder: train -> interrupt -> resume -> eval -> predict -> finetune."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from conftest import default_stop_signals
from vitlab.cli import main

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4", "--no-progress"]


def make_data(root):
    rng = np.random.default_rng(1)
    for split, n in (("train", 24), ("val", 6)):
        for c, name in enumerate(["cat", "dog", "owl"]):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 70, (12, 12, 3)).astype(np.uint8)
                arr[..., c] += 170
                Image.fromarray(arr).save(d / f"{i}.jpg")
    (root / "train" / "cat" / "corrupt.jpg").write_bytes(b"not an image at all")
    return root


@pytest.mark.slow
def test_train_interrupt_resume_eval_predict_finetune(tmp_path, capsys):
    data = make_data(tmp_path / "pets")
    out = tmp_path / "run"
    common = [
        "--data",
        str(data),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--recipe",
        "digits",
        "--batch-size",
        "8",
        *TINY,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "vitlab", "train", *common, "--epochs", "400", "--out", str(out)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_stop_signals
    )
    deadline = time.time() + 180
    while not (out / "last.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: finish the step, save, exit
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "--resume" in stdout and (out / "last.pt").is_file()
    assert "corrupt.jpg" in (out / "bad_files.txt").read_text()

    # resume the interrupted run with fewer steps left: --stop-after, then to the end is covered elsewhere
    assert main(["train", "--out", str(out), "--resume", "--stop-after", "3", "--no-progress"]) == 0
    steps_before = json.loads((out / "summary.json").read_text())["steps"]
    assert steps_before >= 3
    capsys.readouterr()

    assert (
        main(["eval", "--model", str(out / "model"), "--data", str(data), "--cache-dir", str(tmp_path / "cache")]) == 0
    )
    ev = json.loads((out / "model" / "eval.json").read_text())
    assert ev["count"] == 18 and set(ev["per_class"]) == {"cat", "dog", "owl"} and 0 <= ev["top1"] <= ev["top5"] == 1.0
    assert "top-1" in capsys.readouterr().out

    img = data / "val" / "dog" / "0.jpg"
    assert main(["predict", "--model", str(out / "model"), str(img), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred[0]["image"] == str(img) and len(pred[0]["top"]) == 3
    assert abs(sum(t["prob"] for t in pred[0]["top"]) - 1) < 1e-4
    assert main(["predict", "--model", str(out / "model"), str(img)]) == 0
    assert capsys.readouterr().out.startswith(f"{img}: ")

    ft = tmp_path / "ft"
    two = make_two_class(tmp_path / "two")
    args = [
        "finetune",
        "--init",
        str(out / "model"),
        "--data",
        str(two),
        "--img-size",
        "16",
        "--epochs",
        "1",
        "--batch-size",
        "8",
    ]
    assert main([*args, "--out", str(ft), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    cfg = json.loads((ft / "model" / "config.json").read_text())
    assert cfg["img_size"] == [16, 16] and cfg["num_classes"] == 2 and cfg["class_names"] == ["a", "b"]
    assert cfg["extra"]["init"] == str(out / "model") and cfg["extra"]["recipe"] == "auto"
    import vitlab

    m = vitlab.load(ft / "model")
    assert m.pos_embed.shape[1] == m.num_prefix_tokens + (16 // 4) ** 2  # resampled from the 3x3 grid


def make_two_class(root):
    rng = np.random.default_rng(2)
    for c, name in enumerate(["a", "b"]):
        d = root / name
        d.mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (10, 14, 3)).astype(np.uint8) // (c + 1)).save(d / f"{i}.png")
    return root


def test_one_line_errors(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "missing"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab train: error: --data") and err.count("\n") == 1
    assert main(["train", "--resume", "--no-progress"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "nothing"), "--resume", "--no-progress"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp_path), "x.png"]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--time-budget", "soon"])
    assert "duration" in capsys.readouterr().err


def test_help_has_examples(capsys):
    for cmd in ("train", "finetune", "eval", "predict"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "example" in capsys.readouterr().out
