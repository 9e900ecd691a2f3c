"""``vitlab fewshot``: few-shot linear evaluation (Sec. 4.1) and a full linear probe of frozen features."""

from __future__ import annotations

import argparse
import json

from .._units import counted
from ..train.conf.options import DATA_RULE
from ._common import add_device_arg, add_model_arg, add_progress_arg, count


def _shots(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in s.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,5,10,25, got {s!r}") from None
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"shots must be positive integers, got {s!r}")
    return vals


def _l2(s: str) -> float | None:
    if s.strip().lower() == "auto":
        return None
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s!r}")
    return v


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "fewshot",
        help="few-shot linear evaluation (closed-form ridge, 1/5/10/25 shots) and a linear probe",
        description=(
            "Freeze the model, take its pre-logits features, and measure how linearly separable\n"
            'the classes are (paper Sec. 4.1, "Metrics"):\n'
            "  few-shot  regularised least squares onto {-1, 1}^K targets, solved in closed form, on\n"
            "            N images per class of the training split, averaged over --seeds draws;\n"
            "  probe     logistic regression on the features of the whole training split.\n"
            "Accuracies are measured on the test split. Prints a table (or --json) and writes --out.\n\n"
            "Without --data: the data the model's run trained on (its config records it); the embedded digits\n"
            "for a model that records none.\n\n"
            "examples:\n"
            "  vitlab fewshot --model runs/digits                  # the run's own data\n"
            "  vitlab fewshot --model runs/cifar/model --data path/to/cifar10 --shots 1,5,10,25 \\\n"
            "                 --max-train 10000\n"
            "  vitlab fewshot --model vit_ti16 --img-size 32 --data path/to/imagefolder --json"
        ),
        formatter_class=formatter,
    )
    add_model_arg(p)
    p.add_argument(
        "--data",
        default=None,
        help="digits, cifar10, cifar100 or an ImageFolder path (as for `vitlab train`); default: the data the model "
        f"was trained on, else digits. {DATA_RULE}",
    )
    p.add_argument("--shots", type=_shots, default="1,5,10,25", help="training images per class, comma-separated")
    p.add_argument("--seeds", type=int, default=3, help="random draws averaged per shot count")
    p.add_argument(
        "--l2-reg",
        type=_l2,
        default=2.0**10,
        help="L2 strength of the ridge regression on standardised features, or 'auto': pick it from 2^-6..2^14 "
        "on held-out training images (never the test split)",
    )
    p.add_argument("--no-probe", action="store_true", help="skip the full linear probe")
    p.add_argument("--probe-c", type=float, default=1.0, help="inverse L2 strength of the logistic-regression probe")
    p.add_argument("--max-train", type=int, default=None, help="training images used by the probe; None = all")
    p.add_argument("--max-test", type=int, default=None, help="test images evaluated; None = all")
    p.add_argument("--img-size", type=int, default=None, help="input resolution; None = the model's")
    add_device_arg(p)
    p.add_argument(
        "--batch-size", type=count, default=128, help="images per forward pass of the feature extraction (default: 128)"
    )
    p.add_argument("--cache-dir", default=None, help="decoded-image cache (default ~/.cache/vitlab or $VITLAB_CACHE)")
    p.add_argument(
        "--out", default=None, help="JSON file to write (default: fewshot.json next to the model; none for a name)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON result instead of a table")
    add_progress_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from .._text import shown
    from ..devices import resolve_device
    from ..evaluate.fewshot import FewShotConfig, evaluate_fewshot
    from ._common import default_output, model_data, resolve_model, write_json

    cfg = FewShotConfig(
        shots=args.shots,
        seeds=args.seeds,
        l2_reg=args.l2_reg,
        probe=not args.no_probe,
        probe_c=args.probe_c,
        max_train=args.max_train,
        max_test=args.max_test,
        batch_size=args.batch_size,
    )
    device = resolve_device(args.device)  # before loading the model: a typo fails fast
    model, _ = resolve_model(args.model, img_size=args.img_size, fast=True, finite=True)
    data, _, notes = model_data(model, args.model, args.data)  # (its own test split: a folder's held-out part)
    for note in notes:  # --json: stdout is the JSON alone
        print(f"note: {shown(note)}", file=sys.stderr if args.json else sys.stdout)
    model.to(device)
    result = evaluate_fewshot(model, data, cfg, cache_dir=args.cache_dir, progress=not args.no_progress)
    result["model"] = args.model
    target = args.out or default_output(args.model, "fewshot.json")
    out = write_json(target, result) if target else None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{shown(args.model)} on {shown(data)}: {result['num_classes']} classes, {result['feature_dim']}-d features, "
        f"{result['test_size']} test images" + (f" ({result['test_split']})" if result.get("test_split") else "")
    )
    for shots, r in result["fewshot"].items():
        short = r.get("classes_short", 0)
        print(
            f"  {shots:>3}-shot  {100 * r['mean']:6.2f}% +- {100 * r['std']:.2f}  "
            f"({counted(args.seeds, 'seed')}, {counted(r['train_size'], 'train image')}, l2 {r['l2_reg']:g}"
            + (f"; {short} of {result['num_classes']} classes have fewer than {shots} training images (fewest "
               f"{r['fewest']}): all of theirs are used" if short else "")
            + ")"
        )  # fmt: skip
    if "linear_probe" in result:
        lp = result["linear_probe"]
        print(f"  probe     {100 * lp['accuracy']:6.2f}%  (logistic regression on {lp['train_size']} train images)")
    print(f"wrote {shown(out)}" if out else "not written: pass --out FILE to keep the result")
    return 0
