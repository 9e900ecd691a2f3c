"""``benchmarks/busy_machine.py``: its CPU hogs never outlive a measurement (a failed child, an interrupt, a killed
benchmark), it reads the threads from the lines vitlab prints, and its four measurements give the rows and the table
docs/training.md shows. The plumbing tests run stand-in children (a few ms each); the real ``--smoke`` (four torch
processes, most of a minute on two cores) runs with ``VITLAB_BENCH_SMOKE=1``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchscripts import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "busy_machine.py"


def _bench():
    return load("busy_machine")


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
        f"import sys, time; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
        "from benchscripts import load; b = load('busy_machine')\n"
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


def test_threads_are_read_from_the_lines_vitlab_prints() -> None:
    """The start line and an epoch-end change, as :mod:`vitlab.train.sizing.machine` writes them."""
    import math
    from types import SimpleNamespace

    import torch

    from vitlab.train.sizing import machine as cores

    bench = _bench()
    cpu = torch.device("cpu")
    start = cores.threads_line(SimpleNamespace(threads=0), device=cpu, workers=1, step_macs=math.inf)
    watch = cores.ThreadWatch(threads=2, chosen=2, step_macs=math.inf, cap=2, sample=lambda: 1.0,
                              set_threads=lambda n: None)  # fmt: skip
    assert watch.after_epoch(0.1) is None
    change = watch.after_epoch(0.3)  # under half the pace, one core free: 2 -> 1
    t = bench.threads_from_log(f"training ...\n{start}\nepoch 1/3 ...\n{change}\n")
    assert t["threads"] == torch.get_num_threads() and t["workers"] == 1 and "--threads N" in t["why"]
    assert t["changes"] == [[2, 1]]
    assert bench.threads_from_log("no such line") == {"threads": None, "workers": None, "why": None, "changes": []}


def test_table_has_a_row_per_side_with_the_share_kept() -> None:
    bench = _bench()
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


FAKE_VITLAB = """
import json, pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
busy = out.name.endswith("busy")
print(f"cpu: {1 if busy else 2} torch thread(s) (x of 2 core(s) free at start), 0 DataLoader worker(s)")
model = {"img_size": [32, 32], "patch_size": 4, "embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_dim": 256}
ips = 60.0 if busy else 100.0
(out / "summary.json").write_text(json.dumps({"images_per_sec": ips, "steps": 2, "top1": 0.5, "model": model}))
(out / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "images_per_sec": ips}) + "\\n")
"""
FAKE_TIMM = """
import json, os, pathlib, sys
spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
busy = "busy" in pathlib.Path(sys.argv[1]).name
if busy and os.environ.get("FAKE_FAIL"):
    raise SystemExit(5)
r = {"images": 64, "train_s": 2.0 if busy else 1.0, "steps": 4, "top1": 0.5, "threads": 2}
pathlib.Path(spec["result"]).write_text(json.dumps(r))
"""


def _stand_ins(bench, monkeypatch, tmp_path: Path) -> list[int]:
    """Stand-in children for both sides, a short hog lead; returns the list the hogs' pids are appended to."""
    (tmp_path / "fake_vitlab.py").write_text(FAKE_VITLAB)
    (tmp_path / "fake_timm.py").write_text(FAKE_TIMM)
    monkeypatch.setattr(
        bench,
        "vitlab_command",
        lambda data, out, **kw: [sys.executable, str(tmp_path / "fake_vitlab.py"), "--out", str(out)],
    )
    monkeypatch.setattr(bench, "timm_command", lambda spec: [sys.executable, str(tmp_path / "fake_timm.py"), str(spec)])
    monkeypatch.setattr(bench, "HOG_LEAD_S", 0.1)
    pids: list[int] = []
    real = bench.hogs

    @contextlib.contextmanager
    def recorded(n, **kw):
        with real(n, **kw) as procs:
            pids.extend(p.pid for p in procs)
            assert all(_hog_alive(p.pid) for p in procs)  # running while the child runs
            yield procs

    monkeypatch.setattr(bench, "hogs", recorded)
    return pids


def test_four_measurements_give_the_rows_and_the_table(tmp_path: Path, monkeypatch, capsys) -> None:
    bench = _bench()
    pids = _stand_ins(bench, monkeypatch, tmp_path)
    assert bench.main(["--smoke", "--out", str(tmp_path / "out"), "--hogs", "2"]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["side"], r["load"]) for r in rows] == [
        ("vitlab", "quiet"), ("vitlab", "busy"), ("timm script", "quiet"), ("timm script", "busy")
    ]  # fmt: skip
    for r in rows:
        assert r["hogs"] == (2 if r["load"] == "busy" else 0) and len(r["hog_pids"]) == r["hogs"]
        assert {"img_per_s", "threads", "arch", "img", "epochs", "cores", "child_wall_s"} <= set(r)
    assert len(pids) == 4 and not any(_hog_alive(pid) for pid in pids)
    assert [r["threads"] for r in rows] == [2, 1, 2, 2]
    assert rows[2]["arch"] == rows[0]["arch"] and rows[2]["img"] == 32  # the timm script gets vitlab's model
    assert rows[3]["img_per_s"] == 32.0 and rows[3]["batch"] == 16  # 64 images over 2 s of training, 4 steps
    assert "| vitlab | 100.0 | 60.0 | 60% | 2 / 1 |" in out and "| timm script | 64.0 | 32.0 | 50% | 2 / 2 |" in out


def test_a_failing_busy_child_ends_the_run_and_its_hogs(tmp_path: Path, monkeypatch, capsys) -> None:
    bench = _bench()
    pids = _stand_ins(bench, monkeypatch, tmp_path)
    monkeypatch.setenv("FAKE_FAIL", "1")
    assert bench.main(["--smoke", "--out", str(tmp_path / "out")]) == 1
    assert "a measured process failed, exit code 5" in capsys.readouterr().err
    assert len(pids) == 2 and not any(_hog_alive(pid) for pid in pids)  # vitlab busy's and the failed child's


def test_the_timm_child_is_the_photo_baseline_of_defaults_vs_baseline(tmp_path: Path, monkeypatch) -> None:
    """The timm script's process runs ``defaults_vs_baseline.py --photo-baseline SPEC`` (no script imports another):
    it trains the spec's baseline with torch's default threads and writes the result the spec names."""
    import torch

    cmd = _bench().timm_command(tmp_path / "timm-busy.spec.json")
    assert cmd[0] == sys.executable and Path(cmd[1]) == ROOT / "benchmarks" / "defaults_vs_baseline.py"
    assert cmd[2:] == ["--photo-baseline", str(tmp_path / "timm-busy.spec.json")]
    baseline = load("defaults_vs_baseline")
    got: dict = {}
    result = {"top1": 0.5, "steps": 4, "wall_s": 2.5, "train_s": 2.0, "images": 64}

    def fake(data: Path, **kw) -> dict:
        got.update(data=data, **kw)
        return dict(result)

    monkeypatch.setattr(baseline, "run_photo_baseline", fake)
    spec = {"data": str(tmp_path / "photos"), "arch": {"patch_size": 4}, "img": 32, "epochs": 1, "seed": 3,
            "batch": 16, "result": str(tmp_path / "timm-busy.json")}  # fmt: skip
    (tmp_path / "timm-busy.spec.json").write_text(json.dumps(spec))
    monkeypatch.setattr(sys, "argv", [cmd[1], *cmd[2:]])
    baseline.main()
    assert got == {"data": tmp_path / "photos", "arch": {"patch_size": 4}, "img": 32, "epochs": 1, "budget": None,
                   "seed": 3, "batch": 16}  # fmt: skip
    r = json.loads((tmp_path / "timm-busy.json").read_text())
    assert r == {**result, "threads": torch.get_num_threads()}


@pytest.mark.skipif(not os.environ.get("VITLAB_BENCH_SMOKE"), reason="four torch processes: VITLAB_BENCH_SMOKE=1")
def test_smoke_measures_both_sides_quiet_and_busy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": str(home)}
    env.pop("XDG_CACHE_HOME", None)
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
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
