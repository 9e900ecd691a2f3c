"""Training throughput on a quiet and on a busy machine: the default ``vitlab train`` and the plain timm script side
by side (issue 34, "a busy machine tolerated"). A busy machine is one with ``--hogs`` other processes each keeping
one core busy at the same priority (``python -c "while True: pass"``), started before the measured process and
killed after it, always (a failed child, Ctrl-C or SIGTERM included).

Four measurements, one child process each, one after another: vitlab quiet, vitlab busy, the timm script quiet,
the timm script busy. Each child's throughput is its training steps' images per second, not its one-off work:

- vitlab: ``python -m vitlab train --data DIR --img-size S --epochs E --watch-attention off --no-progress``, its
  throughput ``summary.json``'s ``images_per_sec`` (the training epochs' images over their seconds: not the decode,
  not the evaluations), its threads from its first lines (``cpu: N torch thread(s) (...)``) and any change of them
  at an epoch's end;
- the timm script: ``run_photo_baseline`` of ``benchmarks/defaults_vs_baseline.py`` (the photos pre-resized once,
  outside its clock), run as ``python benchmarks/defaults_vs_baseline.py --photo-baseline SPEC``, with the
  architecture the quiet vitlab run chose, the same ``--epochs``, and torch's default thread count (a plain script
  sets none); its throughput the training steps' images over their seconds.

Prints one JSON line per measurement, then a Markdown table with a row per side (quiet img/s, busy img/s, the share
kept, the threads), as docs/training.md ("Threads on a busy machine") has it::

    python benchmarks/busy_machine.py --data ../shared/data/clothing --img-size 64 --epochs 3 --hogs 1
    python benchmarks/busy_machine.py --smoke    # tiny generated photos, one epoch: the plumbing, not a timing

``--data`` is a folder with ``train/`` and ``validation/`` (``test/`` is not read); both sides train on ``train/``
and evaluate on ``validation/``. Everything the children write (runs, decode cache, matplotlib's and other caches)
goes under ``--out`` or a temporary folder, never ``~/.cache``. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from _common import Stopwatch, make_photo_folder

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
HOG_LEAD_S = 1.0
"""Seconds between starting the hogs and the measured child: they are running when it samples the free cores."""
HOG = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the benchmark, even a killed one\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != {parent}:\n"
    "    sys.exit(0)  # the benchmark died before the line above\n"
    "while True: pass\n"
)
"""One core's worth of load at the benchmark's priority: a Python busy loop that ends with its parent."""
THREADS_RE = re.compile(r"cpu: (\d+) torch thread\(s\) \((.*)\), (\d+) DataLoader worker\(s\)")
CHANGE_RE = re.compile(r"cpu: the last epoch ran at .* -> (\d+) torch thread\(s\) \(was (\d+)\)")
SIDES = ("vitlab", "timm script")


class ChildFailed(RuntimeError):
    """A measured child exited non-zero (its hogs were killed all the same: ``hog_pids`` are gone)."""

    def __init__(self, cmd: Sequence[str], rc: int, log: Path, hog_pids: list[int]) -> None:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        super().__init__(f"exit code {rc}: {' '.join(cmd)}\n(log {log}, its end:)\n{tail}")
        self.rc, self.log, self.hog_pids = rc, log, hog_pids


@contextlib.contextmanager
def hogs(n: int, *, lead_s: float | None = None) -> Iterator[list[subprocess.Popen]]:
    """``n`` busy-loop processes for the duration of the block, started ``lead_s`` (default :data:`HOG_LEAD_S`)
    seconds before it, killed and reaped when it ends, however it ends."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", HOG.format(parent=os.getpid())]))
        if procs:
            time.sleep(HOG_LEAD_S if lead_s is None else lead_s)
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_child(cmd: Sequence[str], *, hog_count: int, log: Path, env: dict[str, str]) -> list[int]:
    """Run ``cmd`` to its end with ``hog_count`` hogs beside it, its output into ``log``; return the hogs' pids.
    Raises :class:`ChildFailed` when it fails (after the hogs are gone)."""
    with hogs(hog_count) as procs:
        pids = [p.pid for p in procs]
        with log.open("w") as f:
            rc = subprocess.run(list(cmd), stdout=f, stderr=subprocess.STDOUT, env=env, check=False).returncode
        if rc != 0:
            raise ChildFailed(cmd, rc, log, pids)
    return pids


def child_env(tmp: Path) -> dict[str, str]:
    """The children's environment: this checkout's ``src`` first on the path, every cache under ``tmp``."""
    path = [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
    caches = {"VITLAB_CACHE": "vitlab-cache", "XDG_CACHE_HOME": "xdg-cache", "MPLCONFIGDIR": "mpl",
              "TORCH_HOME": "torch", "HF_HOME": "hf"}  # fmt: skip
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **{k: str(tmp / v) for k, v in caches.items()}}


def threads_from_log(text: str) -> dict[str, Any]:
    """What a vitlab run's lines say of its CPU threads: at start (``threads``, ``workers``, ``why``) and each
    change at an epoch's end (``changes``: ``[[was, now], ...]``). None where a line is missing (not a CPU run)."""
    m = THREADS_RE.search(text)
    changes = [[int(c.group(2)), int(c.group(1))] for c in CHANGE_RE.finditer(text)]
    if m is None:
        return {"threads": None, "workers": None, "why": None, "changes": changes}
    return {"threads": int(m.group(1)), "workers": int(m.group(3)), "why": m.group(2), "changes": changes}


def vitlab_command(data: Path, out: Path, *, img_size: int, epochs: int, seed: int, cache: Path) -> list[str]:
    """The default training command, as a user types it, plus the flags that keep the benchmark's output apart."""
    return [
        sys.executable, "-m", "vitlab", "train", "--data", str(data), "--img-size", str(img_size),
        "--epochs", str(epochs), "--seed", str(seed), "--watch-attention", "off", "--no-progress",
        "--out", str(out), "--overwrite", "--cache-dir", str(cache),
    ]  # fmt: skip


def measure_vitlab(a: argparse.Namespace, data: Path, tmp: Path, *, load: str, env: dict[str, str]) -> dict:
    """One vitlab run, ``load`` ``quiet`` or ``busy``: its row."""
    out = tmp / f"vitlab-{load}"
    cmd = vitlab_command(data, out, img_size=a.img_size, epochs=a.epochs, seed=a.seed, cache=tmp / "cache")
    clock = Stopwatch()
    pids = run_child(cmd, hog_count=a.hogs if load == "busy" else 0, log=tmp / f"vitlab-{load}.log", env=env)
    wall = clock.elapsed()
    s = json.loads((out / "summary.json").read_text())
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    m = s["model"]
    arch = {k: m[k] for k in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_dim")}
    img = m["img_size"][0] if isinstance(m["img_size"], list) else m["img_size"]
    return {
        "side": "vitlab", "load": load, **_fields(a, load, pids, wall), "img_per_s": s["images_per_sec"],
        "epoch_img_per_s": [round(e["images_per_sec"], 1) for e in epochs], "steps": s["steps"],
        **threads_from_log((tmp / f"vitlab-{load}.log").read_text(errors="replace")),
        "arch": arch, "img": img, "top1": s["top1"], "command": " ".join(cmd[1:]),
    }  # fmt: skip


def measure_timm(
    a: argparse.Namespace, data: Path, tmp: Path, *, load: str, arch: dict, img: int, env: dict[str, str]
) -> dict:
    """One run of the plain timm script in a child process (:func:`timm_command`), ``load`` ``quiet`` or ``busy``."""
    spec = {"data": str(data), "arch": arch, "img": img, "epochs": a.epochs, "seed": a.seed, "batch": a.batch,
            "result": str(tmp / f"timm-{load}.json")}  # fmt: skip
    (tmp / f"timm-{load}.spec.json").write_text(json.dumps(spec))
    cmd = timm_command(tmp / f"timm-{load}.spec.json")
    clock = Stopwatch()
    pids = run_child(cmd, hog_count=a.hogs if load == "busy" else 0, log=tmp / f"timm-{load}.log", env=env)
    wall = clock.elapsed()
    r = json.loads(Path(spec["result"]).read_text())
    return {
        "side": "timm script", "load": load, **_fields(a, load, pids, wall),
        "img_per_s": r["images"] / max(r["train_s"], 1e-9), "steps": r["steps"], "threads": r["threads"],
        "workers": 0, "arch": arch, "img": img, "top1": r["top1"], "batch": r["images"] // max(r["steps"], 1),
    }  # fmt: skip


def timm_command(spec: Path) -> list[str]:
    """The timm script's child process: ``defaults_vs_baseline.py --photo-baseline SPEC`` (its
    ``photo_baseline_child``: reads the spec, writes the result file the spec names)."""
    return [sys.executable, str(HERE / "defaults_vs_baseline.py"), "--photo-baseline", str(spec)]


def _fields(a: argparse.Namespace, load: str, pids: list[int], wall: float) -> dict:
    """The fields every measurement's row has beside its own."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"hogs": a.hogs if load == "busy" else 0, "cores": cores, "epochs": a.epochs,
            "hog_pids": pids, "child_wall_s": round(wall, 1)}  # fmt: skip


def table(rows: list[dict]) -> list[str]:
    """The Markdown table: a row per side with its quiet and busy throughput, the share kept, the threads."""
    lines = ["| side | quiet img/s | busy img/s | kept | threads (quiet / busy) |", "|---|---|---|---|---|"]
    for side in SIDES:
        q = next((r for r in rows if r["side"] == side and r["load"] == "quiet"), None)
        b = next((r for r in rows if r["side"] == side and r["load"] == "busy"), None)
        if q is None or b is None:
            continue
        kept = 100 * b["img_per_s"] / max(q["img_per_s"], 1e-9)
        thr = f"{q['threads']} / {b['threads']}" + "".join(f", then {now}" for _, now in b.get("changes", []))
        lines.append(f"| {side} | {q['img_per_s']:.1f} | {b['img_per_s']:.1f} | {kept:.0f}% | {thr} |")
    return lines


def smoke_data(root: Path) -> Path:
    """``root/{train,validation}/<class>/`` with a few tiny generated JPEG photos (portrait and landscape)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("validation", 2)):
        for c in range(2):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 90, (40, 30, 3) if i % 2 else (30, 40, 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i:02d}.jpg", quality=90)
    return root


def run(a: argparse.Namespace, tmp: Path) -> list[dict]:
    """The four measurements, in order; each row printed as a JSON line as soon as it is measured."""
    for old in (tmp / "smoke-data", tmp / "photos"):  # a reused --out (rmtree removes links, not their targets)
        shutil.rmtree(old, ignore_errors=True)
    src = smoke_data(tmp / "smoke-data") if a.smoke else Path(a.data)
    data = make_photo_folder(src, tmp / "photos", split="validation")  # train/ and val/ for both sides
    env = child_env(tmp)
    rows: list[dict] = []
    for load in ("quiet", "busy"):
        rows.append(measure_vitlab(a, data, tmp, load=load, env=env))
        print(json.dumps(rows[-1]), flush=True)
    arch, img = rows[0]["arch"], rows[0]["img"]
    for load in ("quiet", "busy"):
        rows.append(measure_timm(a, data, tmp, load=load, arch=arch, img=img, env=env))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a photo folder with train/ and validation/ (e.g. ../shared/data/clothing)")
    p.add_argument("--img-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3, help="for both sides (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hogs", type=int, default=1, help="busy-loop processes on the busy machine (default 1)")
    p.add_argument("--batch", type=int, default=128, help="the timm script's batch (default 128)")
    p.add_argument("--out", default=None, help="keep the runs, logs and caches here (default: a temporary folder)")
    p.add_argument("--smoke", action="store_true", help="tiny generated photos, 32 px, 1 epoch: the plumbing")
    a = p.parse_args(argv)
    if a.smoke:
        a.img_size, a.epochs = 32, 1
    elif not a.data:
        p.error("--data DIR (or --smoke)")
    if os.environ.get("OMP_NUM_THREADS"):
        print(f"busy_machine: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} caps both sides' threads; unset it "
              "for the default thread counts", file=sys.stderr)  # fmt: skip
    term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM unwinds too: the hogs are killed
    try:
        with contextlib.ExitStack() as stack:
            if a.out:
                tmp = Path(a.out).resolve()
                tmp.mkdir(parents=True, exist_ok=True)
            else:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vitlab-busy-")))
            rows = run(a, tmp)
    except ChildFailed as e:
        print(f"busy_machine: a measured process failed, {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, term)
    print(f"\n{a.hogs} hog(s) on {rows[0]['cores']} core(s), --img-size {a.img_size}, --epochs {a.epochs}:")
    print("\n".join(table(rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
