"""Calibration of a short run (issue 59): a run trains on a folder's training subset with ``--time-budget`` (4 minutes
by default), fits its temperature on every other image of its evaluation split and reports the ECE on the others
(``summary.json``); then ``vitlab eval`` measures the ECE of its probabilities, with the temperature and without, on
further images of the same classes that neither trained the model nor fitted the temperature (the issue asks for a
calibrated ECE of at most 0.06 on 1,000 of them). Prints one JSON line and a Markdown row for
docs/data_check.md.

    python benchmarks/bench_calibration.py --data ../shared/data/cifar10 --per-class 500 --val-per-class 100 \\
        --further-per-class 100 --time-budget 4m
    python benchmarks/bench_calibration.py --data ../shared/data/clothing --per-class 10000 --time-budget 4m
    python benchmarks/bench_calibration.py --smoke      # generated colour classes, a tiny model: checks it runs

Splits: training images from ``train/``; the run's evaluation split (``val/``) and the further images from the
folder's ``validation/`` (or ``test/``) and ``test/``: with both (the clothing photos), ``validation/`` evaluates the
run and ``test/`` is the further set; with ``test/`` alone (CIFAR-10), its first ``--val-per-class`` images of each
class evaluate the run and the next ``--further-per-class`` are the further set. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import class_subset, source_data, work_folder

from vitlab.cli import main as vitlab_main

SMOKE_TRAIN = ["--epochs", "2", "--img-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2"]


def build(src: Path, work: Path, *, per_class: int, val_per_class: int, further_per_class: int) -> tuple[Path, Path]:
    """``(work/data with train/ and val/, work/further: a class tree)`` (see the module's notes)."""
    class_subset(src / "train", work / "data" / "train", per_class=per_class)
    if (src / "validation").is_dir() and (src / "test").is_dir():
        class_subset(src / "validation", work / "data" / "val", per_class=val_per_class)
        class_subset(src / "test", work / "further", per_class=further_per_class)
    elif (src / "test").is_dir():
        class_subset(src / "test", work / "data" / "val", per_class=val_per_class)
        class_subset(src / "test", work / "further", per_class=further_per_class, skip=val_per_class)
    else:
        raise SystemExit(f"--data {src}: needs train/ and test/ (and validation/ where it has one)")
    return work / "data", work / "further"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="an ImageFolder with train/ and test/ (and validation/)")
    ap.add_argument("--per-class", type=int, default=500, help="training images of each class (default 500)")
    ap.add_argument("--val-per-class", type=int, default=100, help="the run's evaluation images of each class")
    ap.add_argument("--further-per-class", type=int, default=100, help="further images of each class (default 100)")
    ap.add_argument("--time-budget", default="4m", help="the run's --time-budget (default 4m)")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one, removed)")
    ap.add_argument("--smoke", action="store_true", help="generated colour classes and a tiny model: checks it runs")
    args = ap.parse_args()
    with work_folder(args.work) as work:
        src, train_args = source_data(args, work, smoke_train=SMOKE_TRAIN)
        if args.smoke:
            args.per_class, args.val_per_class, args.further_per_class = 12, 2, 2
        data, further = build(src, work, per_class=args.per_class, val_per_class=args.val_per_class,
                              further_per_class=args.further_per_class)  # fmt: skip
        run, cache = work / "run", str(work / "cache")
        if vitlab_main(["train", "--data", str(data), "--out", str(run), "--cache-dir", cache, *train_args]) != 0:
            raise SystemExit("the training run failed")
        summary = json.loads((run / "summary.json").read_text())
        out = work / "further_eval.json"
        argv = ["eval", "--model", str(run), "--data", str(further), "--output", str(out), "--cache-dir", cache]
        if vitlab_main(argv) != 0:
            raise SystemExit("vitlab eval failed")
        ev = json.loads(out.read_text())
        cal = summary.get("calibration") or {}
        res = {
            "data": str(src),
            "train_images": summary["data"]["train"],
            "run": " ".join(train_args),
            "top1": summary["top1"],
            "temperature": summary["temperature"],
            "held_out_ece": summary["ece"],
            "held_out_ece_uncalibrated": summary["ece_uncalibrated"],
            "held_out_images": cal.get("ece_images"),
            "fit_images": cal.get("fit_images"),
            "further_images": ev["count"],
            "further_top1": ev["top1"],
            "further_ece": ev["ece"],
            "further_ece_uncalibrated": ev["ece_uncalibrated"],
        }
        print(json.dumps(res))
        print("| data | run | top-1 | T | ECE held out (uncal.) | further images | top-1 | ECE (uncalibrated) |")
        print("|---|---|---|---|---|---|---|---|")
        print(
            f"| {Path(res['data']).name} | {res['run']} | {res['top1']:.1%} | {res['temperature']:.3g} | "
            f"{res['held_out_ece']:.3f} ({res['held_out_ece_uncalibrated']:.3f}) on {res['held_out_images']} | "
            f"{res['further_images']:,} | {res['further_top1']:.1%} | {res['further_ece']:.3f} "
            f"({res['further_ece_uncalibrated']:.3f}) |"
        )


if __name__ == "__main__":
    main()
