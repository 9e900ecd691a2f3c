"""The tables of ``benchmarks/transfer.py`` (docs/transfer.md) from its run folder, and its smoke data."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

ARMS = ("scratch", "scratch_total", "sup", "sup_hires", "mpp", "scratch_default", "sup_default")


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _stats(xs: list[float]) -> str:
    if not xs:
        return "-"
    m = statistics.mean(xs)
    spread = f" ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
    return f"{m:.2f}{spread} ({', '.join(f'{x:.2f}' for x in xs)})"


def tables(root: Path, seeds: list[int], *, hires: int, shots: str, grid: tuple[str, ...]) -> tuple[str, dict]:
    """Markdown tables (mean ± std over seeds, then each seed) and the raw numbers as JSON. The last table is
    every grid point's test accuracy: how much the choice on the 200 dev images matters (it is not used to choose)."""
    raw: dict = {}
    for seed in seeds:
        p = root / f"s{seed}"
        r = raw[seed] = {}
        for name in ARMS:
            ev = json.loads((p / name / "test" / "eval.json").read_text())
            summ = summary(p / name)
            r[name] = {"top1": 100 * ev["top1"], "steps": summ["steps"], "wall_s": summ["wall_s"]}
        for name in ("sup_pretrain", "mpp_pretrain"):
            summ = summary(p / name)
            r[name] = {"top1": 100 * summ["top1"], "steps": summ["steps"], "wall_s": summ["wall_s"]}
        for model in ("sup_pretrain", "mpp_pretrain", "random"):
            r[f"fewshot_{model}"] = _fewshot(p / f"fewshot_{model}")
        for arm in ("scratch", "sup", "mpp"):
            for g in grid:
                ev = json.loads((p / "grid" / arm / g.replace(":", "_") / "test" / "eval.json").read_text())
                r[f"grid/{arm}/{g}"] = {"top1": 100 * ev["top1"]}

    def col(key: str, field: str = "top1") -> str:
        return _stats([raw[x][key][field] for x in seeds])

    def steps(key: str) -> str:
        return str(raw[seeds[0]][key]["steps"])

    chosen = {a: json.loads((root / "dev" / f"{a}.json").read_text())["chosen"] for a in ("scratch", "sup", "mpp")}
    out = [f"Seeds {', '.join(map(str, seeds))}; test top-1 (%) on the target's test split, mean ± std (each seed).\n"]
    out += ["| arm | pre-training steps | target steps | test top-1 | LR (chosen on dev) |", "|---|---:|---:|---:|---|"]
    rows = [
        ("scratch, fine-tuning compute", None, "scratch", "scratch"),
        ("scratch, pre-training + fine-tuning compute", None, "scratch_total", "scratch"),
        ("supervised pre-training on the source, then fine-tuned", "sup_pretrain", "sup", "sup"),
        ("MPP on 50k unlabelled images, then fine-tuned", "mpp_pretrain", "mpp", "mpp"),
        (f"supervised pre-training, fine-tuned at {hires} px", "sup_pretrain", "sup_hires", "sup"),
        ("scratch, `vitlab train` defaults (recipe auto)", None, "scratch_default", None),
        ("supervised pre-training, `vitlab finetune` defaults (recipe finetune)", "sup_pretrain", "sup_default", None),
    ]
    for label, pre, key, arm in rows:
        lr = chosen[arm] if arm else "the command's default"
        out.append(f"| {label} | {steps(pre) if pre else 0} | {steps(key)} | {col(key)} | {lr} |")
    out += ["", "Pre-training: " + f"source top-1 {col('sup_pretrain')}; MPP colour top-1 {col('mpp_pretrain')}.", ""]
    counts = shots.split(",")
    out += ["| few-shot linear (frozen features) | " + " | ".join(f"{k}-shot" for k in counts) + " |"]
    out += ["|---|" + "---:|" * len(counts)]
    for model, label in (("sup_pretrain", "supervised pre-training"), ("mpp_pretrain", "MPP"), ("random", "random")):
        cells = [_stats([raw[x][f"fewshot_{model}"][k] for x in seeds]) for k in counts]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", "| test top-1 of every grid point (32 px, on the 1,000) | " + " | ".join(grid) + " |"]
    out += ["|---|" + "---:|" * len(grid)]
    for arm, label in (("scratch", "scratch"), ("sup", "supervised pre-training"), ("mpp", "MPP")):
        out.append(f"| {label} | " + " | ".join(col(f"grid/{arm}/{g}") for g in grid) + " |")
    return "\n".join(out) + "\n", raw


def _fewshot(folder: Path) -> dict[str, float]:
    res = json.loads((folder / "fewshot.json").read_text())
    return {str(k): 100 * r["mean"] for k, r in res["fewshot"].items()}


def smoke_data(root: Path) -> Path:
    """Four classes of tiny generated images (two source, two target), each class its own colour."""
    from PIL import Image

    data = root / "cifar"
    for split, n in (("train", 14), ("test", 4)):
        for k, c in enumerate(("src_a", "src_b", "tgt_a", "tgt_b")):
            (data / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                rng = random.Random(f"{split}{c}{i}")
                px = bytes(min(255, max(0, 60 * k + rng.randrange(-40, 40))) for _ in range(8 * 8 * 3))
                Image.frombytes("RGB", (8, 8), px).save(data / split / c / f"{i:04d}.png")
    return data
