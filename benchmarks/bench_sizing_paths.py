"""One sizing rule on every path (issue 57): the same photo folder under one time budget, trained from the folder,
from its tar shards (``vitlab data pack``) and with ``--pack``, then replayed from the folder run's ``config.yaml``;
and the lines a photo run for a number of epochs prints about its wall time; the folder's and the packed run's
models evaluated with their centre crop at crop_pct 0.875 and 1. Each run is ``python -m vitlab train``
in its own process, one after the other (run it alone on the machine: a budget is wall time). Prints one JSON line
per run and a Markdown table for docs/training.md ("How a run is sized").

    python benchmarks/bench_sizing_paths.py --data ../shared/data/clothing --split validation --budget 60 --seed 0
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import make_photo_folder


def train(args: list[str], out: Path) -> dict:
    """``vitlab train ARGS --out OUT`` in its own process (replacing a run of an earlier call there): what its summary
    and its log say."""
    cmd = [sys.executable, "-m", "vitlab", "train", *args, "--out", str(out), "--overwrite", "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{log[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    sizing = json.loads((out / "sizing.json").read_text())
    return {
        "img_size": s["model"]["img_size"][0],
        "patch": s["model"]["patch_size"],
        "model": s["model"]["name"],
        "steps": s["steps"],
        "epochs": s["epochs"],
        "top1": round(100 * s["top1"], 2) if s["top1"] is not None else None,
        "wall_s": round(s["wall_s"], 1),
        "replans": len(sizing.get("replans", [])),
        "replan_lines": len(re.findall(r"re-planned to", log)),
        "warnings": [line for line in log.splitlines() if line.startswith("warning:")],
        "lines": [line for line in log.splitlines() if "expected wall time" in line or "--img-size 64 would" in line],
    }


def centre_crops(model: Path, val: Path, cache: Path) -> dict[str, float]:
    """The top-1 of the model folder ``model`` on the class folder ``val``, its centre crop taken at timm's crop_pct
    of 0.875 and at 1 (the whole shorter side): a packed run's crop_pct is chosen for the scale it trained at
    (``vitlab.train.sizing.side.packed_crop_pct``), a square run's is 0.875; both are shown for both."""
    import vitlab
    from vitlab.evaluate import evaluate_model

    out = {}
    for pct in (0.875, 1.0):
        m = vitlab.resolve_model(str(model))
        m.config.crop_pct = pct
        out[f"crop_pct {pct:g}"] = round(
            100 * evaluate_model(m, str(val), cache_dir=str(cache), progress=False)["top1"], 2
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a folder with train/, validation/ and test/")
    ap.add_argument("--split", default="validation", help="the split evaluated (validation or test)")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of --time-budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="sizing_paths_"))
    work.mkdir(parents=True, exist_ok=True)
    folder = make_photo_folder(a.data, work / "photos", split=a.split)
    shards = work / "shards"
    if not (shards / "manifest.json").exists():  # packed from a copy: a pack follows no link out of its folder
        copy = work / "photos_copy"
        for split in ("train", "val"):
            if not (copy / split).exists():
                shutil.copytree((folder / split).resolve(), copy / split)
        subprocess.run([sys.executable, "-m", "vitlab", "data", "pack", str(copy), str(shards), "--no-progress"],
                       check=True, capture_output=True)  # fmt: skip
    budget = ["--time-budget", f"{a.budget:g}", "--seed", str(a.seed)]
    rows = {}
    rows["folder"] = train(["--data", str(folder), *budget], work / "folder")
    rows["shards"] = train(["--data", str(shards), *budget], work / "shards_run")
    rows["pack"] = train(["--data", str(folder), "--pack", *budget], work / "pack")
    rows["replay"] = train(["--config", str(work / "folder" / "config.yaml")], work / "replay")
    rows["epochs"] = train(["--data", str(folder), "--epochs", "10", "--stop-after", "12", "--seed", str(a.seed)],
                           work / "epochs")  # fmt: skip
    for name in ("folder", "pack"):
        rows[name]["centre_crops"] = centre_crops(work / name / "model", folder / "val", work / "cache")
    for name, r in rows.items():
        print(json.dumps({"run": name, **r}))
    print("\n| path | side, patch | steps | top-1 | re-plans | wall |\n|---|---|---|---|---|---|")
    for name, r in rows.items():
        if name != "epochs":
            print(f"| {name} | {r['img_size']} px, {r['patch']} | {r['steps']} | {r['top1']}% | {r['replans']} | "
                  f"{r['wall_s']} s |")  # fmt: skip
    for name in ("folder", "pack"):
        crops = ", ".join(f"{k}: {v}%" for k, v in rows[name]["centre_crops"].items())
        print(f"\n{name}'s model, its centre crop at {crops}")
    print("\n--epochs 10 on the photos: " + " / ".join(rows["epochs"]["lines"]))


if __name__ == "__main__":
    main()
