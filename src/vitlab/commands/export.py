"""``vitlab export``: a model -> a deployable folder (ONNX, TorchScript or vitlab's eager model; float32 or
int8; with token merging or not) checked against the original, with ``export_report.json``."""

from __future__ import annotations

import argparse

from ._common import add_model_arg

_LEGACY_SUFFIXES = (".onnx", ".pt")


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "export",
        help="export a model for deployment (ONNX / int8 / token merging), checked against the original",
        description=(
            "Load a model (a vitlab folder, any checkpoint `vitlab convert` reads, or a registered name for a\n"
            "randomly initialised one) and write a folder that serves alone: the model file (input\n"
            "`pixel_values` (batch, C, H, W), normalised; output `logits`; dynamic batch), config.json (mean,\n"
            "std, input size, interpolation, crop_pct, class names; also as timm's pretrained_cfg) and\n"
            "export_report.json. The exported model then runs beside the original on --check-data (or on\n"
            "generated images): top-1 agreement, accuracy of both, logit cosine, size, batch-1 latency and\n"
            "batch-32 throughput. Past --max-disagreement the last line says so and the exit status is 1.\n"
            "`vitlab predict` and `vitlab eval` run the folder as they run a model folder.\n"
            "Formats: onnx (onnxruntime; pip install 'vitlab[onnx]'), torch (vitlab's eager model as\n"
            "tensors: no extra dependency), torchscript (runs code when loaded: served only with\n"
            "--trust-torchscript). int8: dynamic (onnx, torch, torchscript; vitlab's own int8 layer for the last\n"
            "two) or static (onnx, calibrated on --calib-data). When the report times an int8 model slower than\n"
            "its float32 model at a batch size, the folder keeps both and config.json says which serves which.\n\n"
            "examples:\n"
            "  vitlab export --model runs/photos/model --int8 dynamic --check-data photos/val --out deploy/\n"
            "  vitlab export --model runs/photos/model --int8 static --calib-data photos/train \\\n"
            "      --check-data photos/val --out deploy-static/\n"
            "  vitlab export --model runs/photos/model --format torch --int8 dynamic --tome 8 --out deploy-torch/\n"
            "  vitlab predict --model deploy/ cat.jpg"
        ),
        formatter_class=formatter,
    )
    add_model_arg(p)
    p.add_argument(
        "--format",
        choices=["onnx", "torch", "torchscript"],
        default="onnx",
        help="onnx (ONNX Runtime, default), torch (vitlab's eager model as safetensors) or torchscript",
    )
    p.add_argument("--int8", choices=["dynamic", "static"], default=None, help="int8 quantisation (default: none)")
    p.add_argument("--quant-format", choices=["qdq", "qoperator"], default="qdq", help="ONNX graph of static int8 ops")
    p.add_argument("--tome", type=int, default=0, metavar="R", help="token merging: R patch tokens merged per block")
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default: export-<format>[-int8-<mode>][-tome<R>] in the model folder, or <name>-... "
        "here for a name). A file name ending in .onnx/.pt writes that file alone, float32, without report",
    )
    p.add_argument("--check-data", default=None, metavar="DIR", help="images to check the export on (ImageFolder)")
    p.add_argument("--check-limit", type=int, default=500, metavar="N", help="at most N check images (spread evenly)")
    p.add_argument("--calib-data", default=None, metavar="DIR", help="calibration images for --int8 static")
    p.add_argument("--calib-limit", type=int, default=256, metavar="N", help="at most N calibration images")
    p.add_argument(
        "--max-disagreement",
        default="1%",
        metavar="F",
        help="largest share of check images whose top-1 may differ from the float32 model's (1%% or 0.01)",
    )
    p.add_argument("--timing-runs", type=int, default=10, metavar="N", help="batch-1 runs per model for the latency")
    p.add_argument("--no-timing", action="store_true", help="skip the latency and throughput measures")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (17 or later; the graph's own is recorded)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |exported - PyTorch| logit difference (float)")
    p.add_argument("--no-check", action="store_true", help="skip the float parity check (the agreement still runs)")
    p.add_argument("--max-image-pixels", type=int, default=89_478_485, metavar="N", help="refuse larger images")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in --out (only its own files; links there are replaced, never followed)",
    )
    p.set_defaults(func=run)


def _fraction(text: str) -> float:
    from ..errors import ConfigError

    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(f"--max-disagreement: {text!r} is not a fraction (1% or 0.01)") from None


def _default_out(args: argparse.Namespace) -> str:
    from ._common import default_output

    tag = args.format + (f"-int8-{args.int8}" if args.int8 else "") + (f"-tome{args.tome}" if args.tome else "")
    return str(default_output(args.model, f"export-{tag}") or f"{args.model.replace('/', '_')}-{tag}")


def run(args: argparse.Namespace) -> int:
    import shlex
    import sys
    from pathlib import Path

    from .._fs import own_folder, writes_onto
    from ..deploy import ExportOptions, export_folder, format_report
    from ..errors import ConfigError
    from ._common import resolve_model

    out = args.out or _default_out(args)
    if Path(out).suffix in _LEGACY_SUFFIXES and not Path(out).is_dir():
        return _single_file(args, Path(out))
    opts = ExportOptions(
        format=args.format,
        int8=args.int8,
        quant_format=args.quant_format,
        tome=args.tome,
        calib_data=args.calib_data,
        calib_limit=args.calib_limit,
        check_data=args.check_data,
        check_limit=args.check_limit,
        max_disagreement=_fraction(args.max_disagreement),
        timing_runs=0 if args.no_timing else args.timing_runs,
        opset=args.opset,
        tolerance=args.tolerance,
        parity_check=not args.no_check,
        overwrite=args.overwrite,
        max_image_pixels=args.max_image_pixels,
    )
    opts.validate()  # before loading the model: a wrong combination fails in a second
    hit = writes_onto([Path(out)], args.model)  # the model folder itself or a file of it (a folder in it is fine)
    if hit is not None and (not hit.is_dir() or hit.resolve() == Path(args.model).resolve()):
        raise ConfigError(f"--out {out}: is the input model {args.model} or a file in it; choose another folder")
    model, _ = resolve_model(args.model)
    if args.out is None and Path(out).is_symlink():  # the default folder, in the model's folder: never written into
        own_folder(out, what="the export")
    command = "vitlab " + shlex.join(sys.argv[1:]) if sys.argv and sys.argv[0] else ""
    rep = export_folder(model, out, opts, source=args.model, command=command)
    print(f"exported {args.model} -> {out}/ ({rep['export']}): {', '.join(rep['files'])}")
    if "tome" in rep:
        t = rep["tome"]
        capped = f" (--tome {t['asked']}: at most {t['r']} a block in this model; recorded r={t['r']})"
        print(
            f"  token merging: {sum(t['schedule'])} tokens merged over {len(t['schedule'])} blocks, "
            f"{t['macs_tome'] / t['macs_fp32']:.2f}x the MACs{capped if t['asked'] != t['r'] else ''}"
        )
    for line in format_report(rep):
        print(line)
    share = 1.0 - rep["agreement"]["top1_agreement"]
    limit = f"--max-disagreement {100 * opts.max_disagreement:g}%"
    if rep["passed"]:
        print(f"passed: {100 * share:.2f}% of the check images change their top-1 class (<= {limit})")
        return 0
    print(
        f"FAILED: {100 * share:.2f}% of the check images change their top-1 class (> {limit}); "
        f"the export in {out} disagrees with the float32 model (see export_report.json)"
    )
    return 1


def _single_file(args: argparse.Namespace, target) -> int:
    """The file alone (the form before folders): float32 ONNX or TorchScript, parity-checked, no report."""
    from pathlib import Path

    from .._fs import writes_onto
    from ..deploy.graph import check_opset
    from ..deploy.model_file import export_model
    from ..errors import ConfigError
    from ..evaluate.calibration import bake_temperature, model_temperature
    from ._common import resolve_model

    asked = [f for f, v in (("--int8", args.int8), ("--tome", args.tome), ("--check-data", args.check_data)) if v]
    if asked or args.format == "torch":
        what = ", ".join(asked) or "--format torch"
        raise ConfigError(
            f"--out {target}: a single file takes no {what}; give a folder (--out DIR) for the full export"
        )
    if args.format == "onnx":
        check_opset(args.opset)
    if Path(target).suffix != {"onnx": ".onnx", "torchscript": ".pt"}[args.format]:
        raise ConfigError(f"--out {target}: a {args.format} file ends in {'.onnx' if args.format == 'onnx' else '.pt'}")
    if writes_onto([target], args.model):  # checked before loading: fail in a second, destroy nothing
        raise ConfigError(f"--out {target}: is the input model {args.model} or a file in it; choose another --out")
    if (target.exists() or target.is_symlink()) and not args.overwrite:
        raise ConfigError(f"--out {target}: already exists; pass --overwrite to replace it")
    model, _ = resolve_model(args.model)
    t = model_temperature(model)
    res = export_model(
        model if t == 1.0 else bake_temperature(model, t),  # logits / T: their softmax is calibrated
        target,
        format=args.format,
        check=not args.no_check,
        tolerance=args.tolerance,
        opset=args.opset,
        overwrite=args.overwrite,
    )
    check = f", max |diff| vs PyTorch {res.max_abs_diff:.1e}" if res.max_abs_diff is not None else ""
    check += f", opset {res.opset}" if res.opset is not None else ""
    also = f" + {', '.join(str(f) for f in res.files[1:])}" if len(res.files) > 1 else ""
    print(f"wrote {res.path}{also} ({res.format}, dynamic batch, {res.seconds:.1f} s{check})")
    if t != 1.0:
        print(f"  its logits are the model's divided by its temperature {t:.4g}: their softmax is calibrated")
    print("  (a file alone: no preprocessing config, no agreement report; --out DIR writes the deployable folder)")
    return 0
