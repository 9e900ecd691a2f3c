"""``benchmarks/busy_machine.py``: its CPU hogs never outlive a measurement (a failed child, an interrupt, a killed
benchmark), its rows and table have the shape docs/training.md shows, and ``--smoke`` runs the four measurements."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "busy_machine.py"


def _bench():
    spec = importlib.util.spec_from_file_location("busy_machine_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hog_alive(pid: int) -> bool:
    """Whether ``pid`` is still a running busy loop (not a zombie, not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"while True: pass" in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_hogs_run_during_the_block_and_die_on_an_interrupt() -> None:
    bench = _bench()
    with pytest.raises(KeyboardInterrupt), bench.hogs(2, lead_s=0.1) as procs:
        pids = [p.pid for p in procs]
        assert len(pids) == 2 and all(_hog_alive(pid) for pid in pids)
        raise KeyboardInterrupt
    assert not any(_hog_alive(pid) for pid in pids)


def test_hog_is_killed_when_the_measured_child_fails(tmp_path: Path) -> None:
    bench = _bench()
    log = tmp_path / "child.log"
    fail = [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]
    with pytest.raises(bench.ChildFailed) as err:
        bench.run_child(fail, hog_count=1, log=log, env=dict(os.environ))
    assert err.value.rc == 3 and "boom" in str(err.value) and len(err.value.hog_pids) == 1
    assert not _hog_alive(err.value.hog_pids[0])
    ok = bench.run_child([sys.executable, "-c", "pass"], hog_count=0, log=log, env=dict(os.environ))
    assert ok == []  # quiet: no hog


def test_hog_dies_with_a_killed_benchmark(tmp_path: Path) -> None:
    """SIGKILL runs no ``finally``: the hog ends itself when its parent dies (Linux)."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("Linux only")
    code = (
        f"import importlib.util, sys, time; s = importlib.util.spec_from_file_location('b', {str(SCRIPT)!r}); "
        "b = importlib.util.module_from_spec(s); s.loader.exec_module(b)\n"
        "with b.hogs(1, lead_s=0.1) as procs:\n    print(procs[0].pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert _hog_alive(pid)
        parent.kill()
        parent.wait()
        for _ in range(50):
            if not _hog_alive(pid):
                break
            time.sleep(0.05)
        assert not _hog_alive(pid)
    finally:
        parent.kill()


def test_threads_are_read_from_the_runs_lines_and_the_table_has_a_row_per_side() -> None:
    bench = _bench()
    text = (
        "cpu: 2 torch thread(s) (2.0 of 2 core(s) free at start; --threads N to choose), 0 DataLoader worker(s)\n"
        "epoch 1/3 ...\ncpu: the last epoch ran at under half the previous one's pace and 1.0 of 2 core(s) are free "
        "now -> 1 torch thread(s) (was 2)\n"
    )
    t = bench.threads_from_log(text)
    assert t == {"threads": 2, "workers": 0, "why": "2.0 of 2 core(s) free at start; --threads N to choose",
                 "changes": [[2, 1]]}  # fmt: skip
    assert bench.threads_from_log("no such line")["threads"] is None
    rows = [
        {"side": "vitlab", "load": "quiet", "img_per_s": 400.0, "threads": 2},
        {"side": "vitlab", "load": "busy", "img_per_s": 260.0, "threads": 1, "changes": []},
        {"side": "timm script", "load": "quiet", "img_per_s": 300.0, "threads": 2},
        {"side": "timm script", "load": "busy", "img_per_s": 90.0, "threads": 2, "changes": [[2, 1]]},
    ]
    lines = bench.table(rows)
    assert lines[0].startswith("| side | quiet img/s | busy img/s | kept |") and len(lines) == 4
    assert lines[2] == "| vitlab | 400.0 | 260.0 | 65% | 2 / 1 |"
    assert lines[3] == "| timm script | 300.0 | 90.0 | 30% | 2 / 2, then 1 |"


def test_smoke_measures_both_sides_quiet_and_busy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": str(home)}
    env.pop("XDG_CACHE_HOME", None)
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["side"], r["load"]) for r in rows] == [
        ("vitlab", "quiet"), ("vitlab", "busy"), ("timm script", "quiet"), ("timm script", "busy")
    ]  # fmt: skip
    for r in rows:
        assert r["img_per_s"] > 0 and isinstance(r["threads"], int) and r["threads"] >= 1
        assert r["hogs"] == (1 if r["load"] == "busy" else 0) and len(r["hog_pids"]) == r["hogs"]
        assert not any(_hog_alive(pid) for pid in r["hog_pids"])
    assert rows[2]["arch"] == rows[0]["arch"] and rows[2]["img"] == rows[0]["img"] == 32
    assert "| vitlab |" in proc.stdout and "| timm script |" in proc.stdout
    assert not (home / ".cache").exists()  # every cache under --out
