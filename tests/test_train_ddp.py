"""Two gloo processes through torchrun on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow  # end to end: torchrun of two processes


def test_torchrun_two_cpu_processes(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("test", 5)):
        for c in range(2):
            d = tmp_path / "data" / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 60, (8, 8, 3)).astype(np.uint8)
                arr[..., c] += 180
                Image.fromarray(arr).save(d / f"{i}.png")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "vitlab",
        "train",
    ]
    cmd += [
        "--data",
        str(tmp_path / "data"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        "--no-progress",
    ]
    cmd += [
        "--dim",
        "16",
        "--depth",
        "1",
        "--heads",
        "2",
        "--patch-size",
        "4",
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--recipe",
        "digits",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if proc.returncode != 0 and "training vit_" not in proc.stdout:
        # torchrun failed to launch (its standalone rendezvous picks a free port, which another process can take
        # first): one more launch; a run that started training and failed is never retried
        first = proc.stderr[-1500:]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
        assert proc.returncode == 0, f"first launch:\n{first}\nsecond launch:\n{proc.stderr[-1500:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2
    assert summary["steps"] == 2 * 4  # 32 images / 8 per step = 4 steps per epoch, split over both ranks
    assert summary["data"]["test"] == 10
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]  # rank 0 alone writes
    assert proc.stdout.count("training vit_") == 1
    assert (out / "model" / "model.safetensors").is_file() and (out / "last.pt").is_file()
