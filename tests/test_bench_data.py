"""``benchmarks/bench_data.py --smoke``: the decode-throughput rows (vitlab's reader, its decoder at full scale,
torchvision's decode_jpeg, timm's loader) on tiny generated JPEGs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: every test here runs the benchmark script

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_prints_one_row_per_decode_path() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_data.py"), "--smoke"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    paths = [r["path"] for r in row["decode_rows"]]
    assert len(paths) == 4 and paths[0].startswith("vitlab reader") and paths[-1].startswith("timm")
    assert all(r["img_per_s_per_core"] > 0 for r in row["decode_rows"])
    assert "x timm's loader" in proc.stdout
