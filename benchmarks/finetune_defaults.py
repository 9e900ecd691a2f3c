"""Does pre-training pay with the default commands (issue 36, item 1)? Pre-train on one data set, then, at equal
wall time on a new one: ``vitlab finetune`` with its defaults, ``vitlab train`` from scratch with the same
architecture, and a linear probe (``vitlab finetune --freeze``) on the same features. Every arm is a plain command
(no recipe, optimizer or LR flags: the defaults are what is measured; ``--pretrain-args`` adds flags to the
pre-training alone), printed before it runs and kept in
``OUT/commands.sh``; each model is then scored once by ``vitlab eval`` on the data's test/ folder (the runs evaluate
on its validation/ folder while they train). Results: ``OUT/results.md`` (a table per budget, mean and each seed) and,
as the last line of stdout, the raw numbers as JSON.

    python benchmarks/finetune_defaults.py --source ../shared/data/cifar10 --data ../shared/data/clothing \\
        --out runs/finetune_defaults                          # 10-minute pre-training, 5- and 10-minute arms, 2 seeds
    python benchmarks/finetune_defaults.py --smoke --out /tmp/ftd   # generated data, 3-second budgets

Resumable: a finished command leaves ``done`` in its folder and is skipped next time. Timings depend on the machine
(and on what else runs on it): the wall-time budgets make the arms comparable only on one machine, in one session.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ARMS = ("finetune", "scratch", "probe")
TITLES = {
    "finetune": "fine-tuned (`vitlab finetune`)",
    "scratch": "from scratch (`vitlab train`)",
    "probe": "linear probe (`vitlab finetune --freeze`)",
}


def arch_flags(arch: dict) -> list[str]:
    """``vitlab train`` flags that rebuild the architecture of a model's ``config.json`` (``arch``)."""
    side = arch["img_size"][0] if isinstance(arch["img_size"], list) else arch["img_size"]
    ratio = arch["mlp_dim"] / arch["embed_dim"]
    flags = ["--img-size", str(side), "--patch-size", str(arch["patch_size"]), "--dim", str(arch["embed_dim"])]
    flags += ["--depth", str(arch["depth"]), "--heads", str(arch["num_heads"]), "--mlp-ratio", f"{ratio:g}"]
    return [*flags, "--pool", str(arch["pool"]), "--posemb", str(arch["posemb"])]


def pretrain_command(
    *, source: Path, img_size: str, budget: str, seed: int, out: Path, extra: str, vitlab: list[str]
) -> list[str]:
    """The pre-training command: ``vitlab train`` with its defaults at ``img_size`` for ``budget``, plus ``extra``
    (``--pretrain-args``)."""
    cmd = [*vitlab, "train", "--data", str(source), "--img-size", img_size, "--time-budget", budget]
    return [*cmd, *shlex.split(extra), "--seed", str(seed), "--no-progress", "--out", str(out)]


def arm_commands(
    *, pretrained: Path, data: Path, budget: str, seed: int, arch: list[str], out: Path, vitlab: list[str]
) -> dict[str, list[str]]:
    """The three arms' commands for one budget and seed (``out``: the folder that holds their run folders)."""
    common = ["--data", str(data), "--time-budget", budget, "--seed", str(seed), "--no-progress"]
    ft = [*vitlab, "finetune", "--init", str(pretrained), *common]
    return {
        "finetune": [*ft, "--out", str(out / "finetune")],
        "scratch": [*vitlab, "train", *common, *arch, "--out", str(out / "scratch")],
        "probe": [*ft, "--freeze", "--out", str(out / "probe")],
    }


def _run(cmd: list[str], folder: Path, commands: Path) -> None:
    """Run ``cmd`` unless ``folder/done`` says it finished (``--overwrite`` replaces an interrupted run), printed
    and appended to ``commands``."""
    if (folder / "done").is_file():
        return
    line = shlex.join(cmd)
    print(line, flush=True)
    with open(commands, "a") as f:
        f.write(line + "\n")
    subprocess.run([*cmd, "--overwrite"], check=True)
    (folder / "done").write_text("")


def _test_view(data: Path, root: Path) -> Path:
    """A folder whose evaluation split is ``data``'s test/ (train/ only names the classes): what ``vitlab eval``
    scores the models on, so that the validation/ folder the runs watched is not the one they are judged on."""
    view = root / "test_view"
    view.mkdir(parents=True, exist_ok=True)
    for name in ("train", "test"):
        link = view / name
        if not link.exists():
            link.symlink_to((data / name).resolve(), target_is_directory=True)
    return view


def _smoke_data(root: Path) -> tuple[Path, Path]:
    """A generated source (4 classes) and target (4 other classes) with train/, validation/ and test/."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, classes in (("source", "abcd"), ("target", "efgh")):
        for split, n in (("train", 24), ("validation", 4), ("test", 4)):
            for i, c in enumerate(classes):
                d = root / name / split / c
                d.mkdir(parents=True, exist_ok=True)
                for k in range(n):
                    arr = rng.integers(0, 90, (16, 16, 3)).astype(np.uint8)
                    arr[..., i % 3] += 120 + 20 * (i // 3)
                    Image.fromarray(arr).save(d / f"{k:02d}.png")
    return root / "source", root / "target"


def report(raw: dict, budgets: list[str]) -> str:
    """``results.md``: per budget, each arm's test top-1 (mean, then each seed) and its steps."""
    lines = []
    for b in budgets:
        lines += [f"### {b} per arm", "", "| arm | test top-1 (%) | per seed | steps |", "|---|---|---|---|"]
        for arm in ARMS:
            rows = [raw[s][arm][b] for s in sorted(raw)]
            tops = [r["test_top1"] for r in rows]
            lines.append(
                f"| {TITLES[arm]} | {sum(tops) / len(tops):.2f} | {', '.join(f'{t:.2f}' for t in tops)} "
                f"| {', '.join(str(r['steps']) for r in rows)} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=Path("../shared/data/cifar10"), help="pre-training data")
    p.add_argument("--data", type=Path, default=Path("../shared/data/clothing"), help="the new data (test/ inside)")
    p.add_argument("--out", type=Path, default=Path("runs/finetune_defaults"))
    p.add_argument("--img-size", default="32", help="the pre-training resolution")
    p.add_argument("--pretrain-budget", default="10m")
    p.add_argument("--budgets", nargs="+", default=["5m", "10m"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument(
        "--pretrain-args",
        default="",
        help="further flags of the pre-training command only, e.g. '--optimizer adamw': the default before a time "
        "budget on small images took Muon (docs/transfer.md's rows)",
    )
    p.add_argument("--smoke", action="store_true", help="generated data and 3-second budgets (a check, not a result)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        a.source, a.data = _smoke_data(a.out / "data")
        a.pretrain_budget, a.budgets, a.seeds, a.img_size = "3s", ["3s"], [0], "16"
    vitlab = [sys.executable, "-m", "vitlab"]
    view, commands = _test_view(a.data, a.out), a.out / "commands.sh"
    raw: dict[str, dict] = {}
    for seed in a.seeds:
        pre = a.out / f"pretrain-{seed}"
        cmd = pretrain_command(source=a.source, img_size=a.img_size, budget=a.pretrain_budget, seed=seed, out=pre,
                               extra=a.pretrain_args, vitlab=vitlab)  # fmt: skip
        _run(cmd, pre, commands)
        arch = arch_flags(json.loads((pre / "model" / "config.json").read_text()))
        raw[str(seed)] = {arm: {} for arm in ARMS}
        for b in a.budgets:
            out = a.out / f"seed{seed}-{b}"
            out.mkdir(parents=True, exist_ok=True)
            cmds = arm_commands(pretrained=pre / "model", data=a.data, budget=b, seed=seed, arch=arch, out=out,
                                vitlab=vitlab)  # fmt: skip
            for arm, c in cmds.items():
                run = out / arm
                _run(c, run, commands)
                score = run / "test_eval.json"
                if not score.is_file():
                    ev = [*vitlab, "eval", "--model", str(run / "model"), "--data", str(view), "--output", str(score)]
                    print(shlex.join(ev), flush=True)
                    with open(commands, "a") as f:
                        f.write(shlex.join(ev) + "\n")
                    subprocess.run(ev, check=True, stdout=subprocess.DEVNULL)
                summary = json.loads((run / "summary.json").read_text())
                raw[str(seed)][arm][b] = {
                    "test_top1": 100 * json.loads(score.read_text())["top1"],
                    "val_top1": 100 * summary["top1"],
                    "steps": summary["steps"],
                }
    (a.out / "results.md").write_text(report(raw, a.budgets))
    print(json.dumps({"raw": raw}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
