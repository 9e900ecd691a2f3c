"""The paper's transfer claims at a scale two CPU cores can run (issue 19; results in docs/transfer.md).

One command runs four comparisons on CIFAR-10 split into disjoint class groups, a small-source ->
small-target protocol in the spirit of VTAB-1k (Zhai et al. 2019):

- source: the six animal classes (30,000 labelled training images);
- target: the four vehicle classes, 1,000 labelled training images (250 a class, a fixed draw), tested on
  all 4,000 vehicle test images. Learning rates are chosen on an 800 / 200 split of those 1,000 (seed 0),
  then every arm is trained on all 1,000 and tested once.

Tables (each arm a plain ``vitlab`` command, printed before it runs and kept in ``OUT/commands.sh``):

1. supervised transfer (Sec. 4.2): pre-train on the source, fine-tune on the target, vs the same model
   from scratch on the target with the fine-tuning compute, and with the pre-training compute added;
2. self-supervision (Sec. 4.6): masked patch prediction on all 50,000 training images without labels,
   then fine-tune, vs the same two scratch arms (MPP gets the same steps and batch as supervised pre-training);
3. higher-resolution fine-tuning (Sec. 3.2): the supervised pre-trained model fine-tuned at 32 px and at
   48 px (1.5x; position embeddings resampled) for the same steps;
4. few-shot linear (Sec. 4.1): ``vitlab fewshot`` on the target from frozen features, pre-trained vs random.

Resumable: a finished step leaves ``done`` in its folder and is skipped next time; an interrupted one
restarts. ``--jobs 2`` runs two commands at once with one thread each (the default on 2 cores); ``--jobs 0`` runs
each command in this process, one after another, with one thread (the same commands without an interpreter start
each: the smoke test's way, 29 commands).

    python benchmarks/transfer.py --data ../shared/data/cifar10 --out runs/transfer
    python benchmarks/transfer.py --smoke            # generated data, tiny model: what CI runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from _common import Stopwatch

ANIMALS = ("bird", "cat", "deer", "dog", "frog", "horse")
VEHICLES = ("airplane", "automobile", "ship", "truck")
GRID = ("sgd:0.01", "sgd:0.03", "adamw:5e-4", "adamw:2e-3")  # optimizer:lr, the same for every arm


@dataclass
class Scale:
    """Everything the protocol's size depends on; ``full`` is the documented run, ``smoke`` the CI one."""

    arch: list[str]
    img: int
    hires: int
    source_per_class: int | None  # None: every training image
    source_val: int
    target_per_class: int
    dev_val_per_class: int
    test_per_class: int | None
    pretrain_epochs: int
    mpp_epochs: int
    ft_epochs: int
    dev_epochs: int
    total_epochs: int  # scratch with the pre-training compute added: same images seen
    batch: int
    pre_batch: int
    shots: str
    fewshot_seeds: int
    grid: tuple[str, ...] = GRID


FULL = Scale(
    arch=["--patch-size", "4", "--dim", "96", "--depth", "4", "--heads", "3", "--mlp-ratio", "2", "--pool", "gap"],
    img=32, hires=48, source_per_class=None, source_val=200, target_per_class=250, dev_val_per_class=50,
    test_per_class=None, pretrain_epochs=10, mpp_epochs=6, ft_epochs=32, dev_epochs=40, total_epochs=332,
    batch=64, pre_batch=128, shots="1,5,10,25", fewshot_seeds=5,
)  # fmt: skip
SMOKE = Scale(
    arch=["--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--mlp-ratio", "2", "--pool", "gap"],
    img=8, hires=12, source_per_class=12, source_val=2, target_per_class=8, dev_val_per_class=2,
    test_per_class=4, pretrain_epochs=1, mpp_epochs=1, ft_epochs=1, dev_epochs=1, total_epochs=2,
    batch=8, pre_batch=8, shots="1,2", fewshot_seeds=1, grid=("adamw:1e-3",),
)  # fmt: skip


@dataclass
class Task:
    name: str
    folder: Path
    command: Callable[[], list[str]]  # built when its dependencies are done (selection results)
    deps: list[str] = field(default_factory=list)
    threads: int = 1


def _link(dst: Path, files: list[Path]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        if not (dst / f.name).exists():
            os.symlink(f.resolve(), dst / f.name)


def make_splits(data: Path, root: Path, s: Scale, *, source: tuple[str, ...], target: tuple[str, ...]) -> None:
    """ImageFolders of symlinks: source, mpp (every class, labels unused), target_dev (800/200),
    target (1,000 + a small val/ the trainer evaluates each epoch), target_eval (1,000 + the test split)."""
    if (root / "done").exists():
        return
    rng = random.Random(0)
    files = {c: sorted((data / "train" / c).iterdir()) for c in source + target}
    tests = {c: sorted((data / "test" / c).iterdir()) for c in source + target}
    for c in source:
        _link(root / "source/train" / c, files[c][: s.source_per_class])
        _link(root / "source/val" / c, tests[c][: s.source_val])
    for c in source + target:
        _link(root / "mpp/train" / c, files[c][: s.source_per_class])
        _link(root / "mpp/val" / c, tests[c][: s.source_val])
    for c in target:
        pick = rng.sample(files[c], s.target_per_class)
        dev_val = s.dev_val_per_class
        _link(root / "target_dev/train" / c, pick[dev_val:])
        _link(root / "target_dev/val" / c, pick[:dev_val])
        _link(root / "target/train" / c, pick)
        _link(root / "target/val" / c, tests[c][:2])  # only so the trainer has an eval split; never reported
        _link(root / "target_eval/train" / c, pick)
        _link(root / "target_eval/test" / c, tests[c][: s.test_per_class])
    (root / "done").write_text("")


def _opt(choice: str) -> list[str]:
    name, lr = choice.split(":")
    return ["--optimizer", name, "--lr", lr, "--weight-decay", "0" if name == "sgd" else "0.05"]


def _classify(s: Scale, epochs: int, *, batch: int | None = None, warmup: str = "50") -> list[str]:
    return [
        "--recipe", "small-data", "--batch-size", str(batch or s.batch), "--epochs", str(epochs),
        "--warmup-steps", warmup,
        "--clip-grad", "1", "--crop-scale", "0.6,1", "--hflip", "0.5", "--label-smoothing", "0.1", "--mixup", "0",
        "--cutmix", "0", "--randaugment", "none", "--random-erasing", "0", "--drop-path", "0",
    ]  # fmt: skip


def build_tasks(root: Path, s: Scale, seeds: list[int], vitlab: list[str]) -> dict[str, Task]:
    """The dependency graph of every command; learning rates are chosen on seed 0's dev split."""
    d, tasks = root / "data", {}
    run = ["--keep", "last", "--no-progress", "--threads", "1", "--overwrite"]
    sel: dict[str, str] = {}

    def add(name: str, cmd: Callable[[], list[str]], deps: list[str] | None = None) -> None:
        tasks[name] = Task(name, root / name, cmd, deps or [])

    def choice(arm: str) -> str:
        if arm not in sel:
            sel[arm] = select(root, arm, s.grid)
        return sel[arm]

    def init(arm: str, seed: int) -> list[str]:
        if arm == "scratch":
            return [*vitlab, "train", *s.arch]
        return [*vitlab, "finetune", "--init", str(root / f"s{seed}/{arm}_pretrain/model")]

    for seed in seeds:
        p = f"s{seed}"
        pre = [*s.arch, "--img-size", str(s.img), "--seed", str(seed), *run]
        add(f"{p}/sup_pretrain", lambda pre=pre, p=p: [
            *vitlab, "train", "--data", str(d / "source"), "--out", str(root / p / "sup_pretrain"), *pre,
            *_classify(s, s.pretrain_epochs, batch=s.pre_batch, warmup="234" if s is FULL else "1"),
            *_opt("adamw:2e-3")])  # fmt: skip
        add(f"{p}/mpp_pretrain", lambda pre=pre, p=p: [
            *vitlab, "train", "--objective", "mpp", "--data", str(d / "mpp"), "--out", str(root / p / "mpp_pretrain"),
            *pre, "--recipe", "mpp", "--batch-size", str(s.pre_batch), "--epochs", str(s.mpp_epochs),
            "--optimizer", "adam", "--lr", "1e-3", "--warmup-steps", "234" if s is FULL else "1",
            "--crop-scale", "0.6,1", "--hflip", "0.5"])  # fmt: skip
    for arm in ("scratch", "sup", "mpp"):
        for g in s.grid:
            name = f"dev/{arm}/{g.replace(':', '_')}"
            deps = [] if arm == "scratch" else [f"s0/{arm}_pretrain"]
            add(name, lambda arm=arm, g=g, name=name: [
                *init(arm, 0), "--data", str(d / "target_dev"), "--out", str(root / name), "--img-size", str(s.img),
                *_classify(s, s.dev_epochs), *_opt(g), "--seed", "0", *run], deps)  # fmt: skip
    dev = {arm: [f"dev/{arm}/{g.replace(':', '_')}" for g in s.grid] for arm in ("scratch", "sup", "mpp")}
    for seed in seeds:
        p = f"s{seed}"
        arms = {  # name: (arm: its init and the dev runs that pick its LR, epochs, image size, tuned)
            "scratch": ("scratch", s.ft_epochs, s.img, True),
            "scratch_total": ("scratch", s.total_epochs, s.img, True),
            "sup": ("sup", s.ft_epochs, s.img, True),
            "sup_hires": ("sup", s.ft_epochs, s.hires, True),
            "mpp": ("mpp", s.ft_epochs, s.img, True),
            "scratch_default": ("scratch", s.ft_epochs, s.img, False),  # what a user gets: the command's defaults
            "sup_default": ("sup", s.ft_epochs, s.img, False),
        }
        for name, (arm, epochs, size, tuned) in arms.items():
            out = f"{p}/{name}"
            deps = (dev[arm] if tuned else []) + ([] if arm == "scratch" else [f"{p}/{arm}_pretrain"])
            add(out, lambda arm=arm, epochs=epochs, size=size, out=out, seed=seed, tuned=tuned: [
                *init(arm, seed), "--data", str(d / "target"), "--out", str(root / out), "--img-size", str(size),
                *([*_classify(s, epochs), *_opt(choice(arm))] if tuned else ["--epochs", str(epochs)]),
                "--seed", str(seed), *run], deps)  # fmt: skip
            add(f"{out}/test", lambda out=out: [
                *vitlab, "eval", "--model", str(root / out / "model"), "--data", str(d / "target_eval"),
                "--output", str(root / out / "test" / "eval.json")], [out])  # fmt: skip
        for arm in ("scratch", "sup", "mpp"):  # sensitivity: every grid LR trained on the 1,000 and tested
            for g in s.grid:
                out = f"{p}/grid/{arm}/{g.replace(':', '_')}"
                deps = [] if arm == "scratch" else [f"{p}/{arm}_pretrain"]
                add(out, lambda arm=arm, g=g, out=out, seed=seed: [
                    *init(arm, seed), "--data", str(d / "target"), "--out", str(root / out), "--img-size", str(s.img),
                    *_classify(s, s.ft_epochs), *_opt(g), "--seed", str(seed), *run], deps)  # fmt: skip
                add(f"{out}/test", lambda out=out: [
                    *vitlab, "eval", "--model", str(root / out / "model"), "--data", str(d / "target_eval"),
                    "--output", str(root / out / "test" / "eval.json")], [out])  # fmt: skip
        for model in ("sup_pretrain", "mpp_pretrain", "random"):
            deps = [f"{p}/sup_pretrain"] + ([f"{p}/{model}"] if model != "random" else [])
            src = root / p / model / "model"
            add(f"{p}/fewshot_{model}", lambda src=src, out=f"{p}/fewshot_{model}", seed=seed: [
                *vitlab, "fewshot", "--model", str(src), "--data", str(d / "target_eval"), "--shots", s.shots,
                "--seeds", str(s.fewshot_seeds), "--no-probe",
                "--out", str(root / out / "fewshot.json")], deps)  # fmt: skip
        add(f"{p}/random", lambda p=p, seed=seed: [
            sys.executable, __file__, "--random-init", str(root / p / "sup_pretrain/model"),
            str(root / p / "random/model"), str(seed)], [f"{p}/sup_pretrain"])  # fmt: skip
        tasks[f"{p}/fewshot_random"].deps.append(f"{p}/random")
    return tasks


def select(root: Path, arm: str, grid: tuple[str, ...]) -> str:
    """The grid point with the best final-epoch accuracy on the 200 dev images (ties: the first)."""
    scores = {g: summary(root / f"dev/{arm}/{g.replace(':', '_')}")["top1"] for g in grid}
    best = max(grid, key=lambda g: scores[g])
    (root / "dev" / f"{arm}.json").write_text(json.dumps({"scores": scores, "chosen": best}, indent=1))
    return best


def random_init(template: str, out: str, seed: int) -> None:
    """A model folder with the architecture and preprocessing of ``template`` and random weights."""
    import torch

    import vitlab

    torch.manual_seed(seed)
    vitlab.save(vitlab.VisionTransformer(vitlab.load(template).config), out, overwrite=True)


def run_tasks(root: Path, tasks: dict[str, Task], *, jobs: int, log: Callable[[str], None]) -> None:
    """Run every task whose dependencies are done, ``jobs`` at a time (0: each in this process, one after another);
    a failure stops the run."""
    done = {n for n, t in tasks.items() if (t.folder / "done").exists()}
    running: dict = {}
    script = root / "commands.sh"

    def go(t: Task) -> tuple[Task, int, float]:
        cmd = t.command()
        with open(script, "a") as f:
            f.write(shlex.join(cmd) + "\n")
        log(f"$ {shlex.join(cmd)}")
        t.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(t.threads), "MKL_NUM_THREADS": str(t.threads)}
        clock = Stopwatch()
        with open(t.folder.parent / f"{t.folder.name}.log", "w") as out:
            if jobs == 0:
                rc = _in_process(cmd, out, threads=t.threads)
            else:
                rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        return t, rc, clock.elapsed()

    def finish(t: Task, rc: int, secs: float) -> None:
        if rc != 0:
            raise SystemExit(f"transfer: {t.name} failed (exit {rc}); see {t.folder}.log")
        (t.folder / "done").write_text(f"{secs:.1f}\n")
        done.add(t.name)
        log(f"done {t.name} in {secs:.0f} s ({len(done)}/{len(tasks)})")

    def ready() -> list[Task]:
        return [t for t in tasks.values() if t.name not in done | set(running) and all(d in done for d in t.deps)]

    if jobs == 0:  # in the main thread: the commands' stop signals are installed there
        while len(done) < len(tasks):
            if not (now := ready()):
                raise SystemExit(f"transfer: unmet dependencies: {sorted(set(tasks) - done)}")
            finish(*go(now[0]))
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while len(done) < len(tasks):
            for t in ready()[: jobs - len(running)]:
                running[t.name] = pool.submit(go, t)
            if not running:
                raise SystemExit(f"transfer: unmet dependencies: {sorted(set(tasks) - done)}")
            finished, _ = wait(running.values(), return_when=FIRST_COMPLETED)
            for fut in finished:
                t, rc, secs = fut.result()
                del running[t.name]
                finish(t, rc, secs)


def _in_process(cmd: list[str], out: IO[str], *, threads: int) -> int:
    """Exit status of ``cmd`` (``python -m vitlab ...`` or this script) run in this process, its output to ``out``."""
    import torch

    from vitlab.cli import main as vitlab_main

    args = cmd[3:] if cmd[1:3] == ["-m", "vitlab"] else cmd[2:]
    run = vitlab_main if cmd[1:3] == ["-m", "vitlab"] else main
    torch.set_num_threads(threads)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            return run(args)
        except SystemExit as e:  # argparse's exits
            return e.code if isinstance(e.code, int) else 1


# -- the tables (docs/transfer.md) from the run folder, and the smoke data ----------------------------------------

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="CIFAR-10 as an ImageFolder (train/<class>, test/<class>)")
    ap.add_argument("--out", type=Path, help="run folder (resumable); default runs/transfer, or a temp dir")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--jobs", type=int, default=2, help="commands at once, one thread each (0: in this process)")
    ap.add_argument("--smoke", action="store_true", help="generated data, tiny model, one seed: seconds")
    ap.add_argument("--random-init", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.random_init:
        random_init(a.random_init[0], a.random_init[1], int(a.random_init[2]))
        return 0
    scale, seeds = (SMOKE, [0]) if a.smoke else (FULL, [int(x) for x in a.seeds.split(",")])
    root = a.out or (Path(tempfile.mkdtemp(prefix="transfer-smoke-")) if a.smoke else Path("runs/transfer"))
    root.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        data, groups = smoke_data(root), (("src_a", "src_b"), ("tgt_a", "tgt_b"))
    elif a.data is None:
        ap.error("--data is required (or --smoke)")
    else:
        data, groups = a.data, (ANIMALS, VEHICLES)
    make_splits(data, root / "data", scale, source=groups[0], target=groups[1])
    vitlab = [sys.executable, "-m", "vitlab"]
    tasks = build_tasks(root, scale, seeds, vitlab)
    clock = Stopwatch()
    run_tasks(root, tasks, jobs=a.jobs, log=lambda m: print(m, flush=True))
    md, raw = tables(root, seeds, hires=scale.hires, shots=scale.shots, grid=scale.grid)
    (root / "results.md").write_text(md)
    print(md)
    print(json.dumps({"out": str(root), "seeds": seeds, "wall_s": round(clock.elapsed(), 1), "raw": raw}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
