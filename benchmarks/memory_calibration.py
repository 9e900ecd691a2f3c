"""The run's memory estimate (vitlab.train.sizing.memory) against the peak resident memory of real training runs,
on CPU.

Each configuration trains one epoch of 4 optimizer steps and one evaluation of 256 images in its own process
(data loader workers off: the main process is measured), from generated images. When the estimate is made (before
the model, the optimizer or the loaders allocate), the process's peak-RSS mark is reset (``/proc/self/clear_refs``)
and its RSS noted; after the run the peak (``VmHWM``) less that RSS is what the run added, which the estimate
should cover (never more than ~20 % under), for the training steps and for the evaluation that follows them
(its peak is measured from the RSS at the estimate too). A DataLoader worker's own memory is measured on one more run
(``Private_*`` of ``/proc/PID/smaps_rollup`` while it works). Two rows run with glibc's mmap threshold fixed at
1 MiB (``MALLOC_MMAP_THRESHOLD_``), one of them with the fused CPU blocks off, to show the tensors alive without
the heap's fragmentation. Each run stays under ~2 GiB.

    PYTHONPATH=src python benchmarks/memory_calibration.py [NAME ...]
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL = {"patch_size": 4, "embed_dim": 192, "depth": 9, "num_heads": 12, "mlp_ratio": 2}
TINY = {"patch_size": 4, "embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_ratio": 2}
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "1048576"}  # glibc: every tensor over 1 MiB mmap-ed, returned when freed
CONFIGS: dict[str, dict] = {  # name -> image size, batch, TrainConfig fields
    "tiny 32px b128": {"img": 32, "batch": 128, "arch": TINY},
    "small 64px b32": {"img": 64, "batch": 32, "arch": SMALL},
    "small 64px b32 ckpt": {"img": 64, "batch": 32, "arch": SMALL, "grad_checkpointing": True},
    "small 64px b32 drop 0.5": {"img": 64, "batch": 32, "arch": SMALL, "token_drop": 0.5},
    "small 64px b32 ema": {"img": 64, "batch": 32, "arch": SMALL, "ema": 0.999},
    "small 64px b32 dropout": {"img": 64, "batch": 32, "arch": SMALL, "dropout": 0.1},
    "small 64px b8 attn-drop": {"img": 64, "batch": 8, "arch": {**SMALL, "attn_drop_rate": 0.1}},
    "small 64px b8 attn-drop, fixed mmap threshold": {
        "img": 64,
        "batch": 8,
        "arch": {**SMALL, "attn_drop_rate": 0.1},
        "env": FIXED_MMAP,
    },
    "small 64px b32 ckpt, fused blocks off, fixed mmap threshold": {
        "img": 64,
        "batch": 32,
        "arch": SMALL,
        "grad_checkpointing": True,
        "unfused": True,
        "env": FIXED_MMAP,
    },
    "mpp small 64px b32": {"img": 64, "batch": 32, "arch": SMALL, "objective": "mpp"},
    "vit_ti16 224px b16": {"img": 224, "batch": 16, "model": "vit_ti16"},
    "vit_r_ti16 224px b8": {"img": 224, "batch": 8, "model": "vit_r_ti16"},
}


def make_data(root: Path, img: int, n_train: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", 256)):
        for c in range(2):
            d = root / split / f"c{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n // 2):
                Image.fromarray(rng.integers(0, 256, (img, img, 3), dtype=np.uint8)).save(d / f"{i}.png")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(name: str, tmp: Path) -> dict:
    """One run in this process: the estimate and the measured peak over the RSS at the estimate."""
    # (imported here: the "worker" run's process, and the DataLoader worker it forks, never hold these modules)
    from _common import sizing_memory as memory
    from _common import sizing_sizer as setup

    from vitlab.train import TrainConfig, get_recipe

    spec = CONFIGS[name]
    data = tmp / f"data{spec['img']}_{spec['batch']}"
    if not data.exists():
        make_data(data, spec["img"], 4 * spec["batch"])
    seen: dict = {}

    def probe(device):
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: what follows is the run's own peak
        seen["rss"] = _status("VmRSS")
        return 1 << 40, "calibration"

    real_fit = setup.memory_split

    def memory_split(*a, **k):
        got = real_fit(*a, **k)
        seen["estimate"] = got.estimate
        return got

    from _common import engine_trainer as trainer

    real_end = trainer.Trainer._end_epoch

    def end_epoch(self, res):
        seen["train"] = _status("VmHWM") - seen["rss"]  # the training steps' peak, then the evaluation's
        Path("/proc/self/clear_refs").write_text("5")
        return real_end(self, res)

    memory.available_memory = probe
    setup.memory_split = memory_split
    trainer.Trainer._end_epoch = end_epoch
    objective = spec.get("objective", "classify")
    recipe = get_recipe(
        "mpp" if objective == "mpp" else "auto",
        epochs=1,
        batch_size=spec["batch"],
        warmup_steps=0,
        ema=spec.get("ema"),
        token_drop=spec.get("token_drop"),
        dropout=spec.get("dropout"),
        label_smoothing=0.0,
    )
    cfg = TrainConfig(
        recipe=recipe,
        data=str(data),
        out=str(tmp / "run"),
        model=spec.get("model"),
        arch=spec.get("arch", {}),
        img_size=spec["img"],
        objective=objective,
        grad_checkpointing=spec.get("grad_checkpointing", False),
        cache_dir=str(tmp / "cache"),
        workers=0,
        progress=False,
        recipe_given=[f.name for f in dataclasses.fields(recipe)],  # the recipe as given: nothing fitted to the data
    )
    import contextlib

    from _common import fused_block

    from vitlab.train import fit

    with fused_block.disabled() if spec.get("unfused") else contextlib.nullcontext():
        fit(cfg, overwrite=True)
    est = seen["estimate"]
    return {
        "name": name,
        "train_estimate": est.states + est.activations + est.objective + est.data,
        "eval_estimate": est.states + est.held_in_evaluation + est.evaluation + est.data,
        "train": seen["train"],
        "eval": _status("VmHWM") - seen["rss"],
    }


def worker_memory(tmp: Path) -> int:
    """Private memory of one DataLoader worker of a training run, sampled while it works."""
    import torch
    from torch.utils.data import DataLoader

    from vitlab.data import ArrayDataset, load_data, train_transform

    data = tmp / "data64_32"
    if not data.exists():
        make_data(data, 64, 128)
    d = load_data(str(data), cache_dir=str(tmp / "cache"), progress=False)
    tf = train_transform(img_size=(64, 64), mean=(0.5,) * 3, std=(0.5,) * 3, in_chans=3)
    ds = ArrayDataset(d.train.images, d.train.labels, transform=tf, in_chans=3)
    torch.ones(1 << 26)  # a parent that has computed (its pages are the worker's after the fork)
    loader = DataLoader(ds, batch_size=32, num_workers=1, persistent_workers=True)
    peak = 0
    for _ in range(3):
        for _batch in loader:
            for pid in loader._iterator._workers:
                text = Path(f"/proc/{pid.pid}/smaps_rollup").read_text()
                priv = sum(int(x.split()[1]) for x in text.splitlines() if x.startswith("Private_"))
                peak = max(peak, priv * 1024)
    return peak


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        name, tmp = sys.argv[2], Path(sys.argv[3])
        result = worker_memory(tmp) if name == "worker" else child(name, tmp)
        print("RESULT " + json.dumps(result), flush=True)
        return
    names = sys.argv[1:] or list(CONFIGS)
    mib = 2**20
    print(
        "| configuration | training steps: estimate / measured, MiB | ratio "
        "| evaluation: estimate / measured, MiB | ratio |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="vitlab-memcal-") as t:
        for name in [*names, "worker"]:
            cmd = [sys.executable, __file__, "--child", name, t]
            env = {**os.environ, **CONFIGS.get(name, {}).get("env", {})}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            r = json.loads(next(s for s in out.splitlines() if s.startswith("RESULT "))[7:])
            if name == "worker":
                print(f"\nDataLoader worker, private memory: {r / mib:.0f} MiB")
                continue
            cells = [
                f"{r[k + '_estimate'] / mib:.0f} / {r[k] / mib:.0f} | {r[k + '_estimate'] / r[k]:.2f}"
                for k in ("train", "eval")
            ]
            print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
