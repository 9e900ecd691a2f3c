"""``vitlab bench``: images/s, GFLOP/s and fraction of matmul peak, optionally against timm / HF."""

from __future__ import annotations

import argparse
import json
import sys

from ._common import count


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "bench",
        help="measure inference / training throughput, vs timm or Hugging Face in the same run",
        description=(
            "Time inference (forward under torch.inference_mode) or a full training step (forward,\n"
            "backward, optimizer: vitlab's is the fused AdamW `vitlab train` builds, the reference's\n"
            "plain torch.optim.AdamW) of a model, report images/s and achieved GFLOP/s as a fraction\n"
            "of the machine's dense-matmul peak (measured in the same run). With --vs timm|hf the\n"
            "equivalent reference model is timed interleaved with ours in the same process and the\n"
            "ratio of the medians is reported (> 1: vitlab is faster), with the per-pair ratios'\n"
            "median, its 95% bootstrap interval (a target inside it needs more --steps) and range.\n"
            "--vs vitlab times a second copy of our model: an A/A check of the noise floor.\n"
            "--isolate runs each model in its own worker process instead (same interleaving), so\n"
            "neither pays page faults for the other's memory: use it for training steps.\n"
            "Benchmarks of a shared machine are noisy: compare ratios, not absolute numbers across\n"
            "runs. See docs/performance.md.\n\n"
            "examples:\n"
            "  vitlab bench --model vit_s16 --batch-size 32 --vs timm\n"
            "  vitlab bench --model vit_b16 --batch-size 16 --vs timm --json\n"
            "  vitlab bench --model runs/flowers --batch-size 1     # a trained model's architecture\n"
            "  vitlab bench --model vit_s16 --compile --vs timm      # both compiled, compile time reported\n"
            "  vitlab bench --model vit_s16 --compile --ref-eager --vs timm   # compiled vitlab vs eager timm\n"
            "  vitlab bench --mode train --model vit_ti16 --img-size 32 --patch-size 4 --dim 192 --depth 9 \\\n"
            "      --heads 3 --mlp-ratio 2 --num-classes 10 --batch-size 128 --vs timm --isolate"
        ),
        formatter_class=formatter,
    )
    p.add_argument(
        "--model",
        default="vit_s16",
        help="a registered name (see `vitlab models`), or a run or model folder, a checkpoint or a public name: its "
        "architecture is timed, with random weights (the weights do not change the time)",
    )
    p.add_argument(
        "--mode", choices=["infer", "train"], default="infer", help="inference forward or full training step"
    )
    p.add_argument("--batch-size", type=count, default=32, help="images per timed step (default: 32)")
    p.add_argument("--img-size", type=int, default=None, help="input resolution (default: the model's, 224)")
    p.add_argument("--patch-size", type=int, default=None, help="override the patch size")
    p.add_argument("--dim", type=int, default=None, help="override the width D")
    p.add_argument("--depth", type=int, default=None, help="override the number of layers")
    p.add_argument("--heads", type=int, default=None, help="override the number of heads")
    p.add_argument("--mlp-ratio", type=float, default=None, help="MLP width as a multiple of D")
    p.add_argument(
        "--num-classes", type=int, default=None, help="classes of the head (default: the model's; 1000 for a name)"
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="bfloat16/float16 run under autocast",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... or auto (CUDA when available)")
    p.add_argument(
        "--vs",
        choices=["timm", "hf", "vitlab"],
        default=None,
        help="time this reference interleaved with vitlab (vitlab: an A/A noise check)",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="default",
        default=None,
        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
        help="torch.compile both models (this mode; inference also freezes the weights); compile time is reported",
    )
    p.add_argument(
        "--ref-eager",
        action="store_true",
        help="with --compile: compile vitlab only and time the reference eager, as its users run it",
    )
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run each model in a worker process of its own (still one step of each in turn), so the two do not "
        "share a C heap and its page faults; how each library runs in its own user's program",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--steps", type=count, default=10, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--no-peak", action="store_true", help="skip the matmul-peak measurement")
    p.add_argument("--peak-size", type=int, default=2048, help="n of the n x n matmul that measures the peak")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from .._text import shown
    from ..bench import benchmark, model_overrides
    from ..devices import cap_threads
    from ..models import create_model
    from ..resolve import model_source, source_config

    if args.threads is not None and args.threads > 0:
        args.threads, line = cap_threads(args.threads)
        if line:
            print(line, file=sys.stderr)
    source = model_source(args.model)  # the one model rule; only the architecture is read, never the weights
    for note in source.notes:
        print(f"note: {shown(note)}", file=sys.stderr)
    model = args.model if source.kind == "architecture" else source_config(source)
    base_dim = None
    if args.mlp_ratio is not None and args.dim is None:
        if isinstance(model, str):
            with torch.device("meta"):  # only to read the width; allocates nothing
                base_dim = create_model(model).config.embed_dim
        else:
            base_dim = model.embed_dim
    overrides = model_overrides(
        img_size=args.img_size,
        patch_size=args.patch_size,
        dim=args.dim,
        depth=args.depth,
        heads=args.heads,
        mlp_ratio=args.mlp_ratio,
        base_dim=base_dim,
    )
    res = benchmark(
        model,
        mode=args.mode,
        batch_size=args.batch_size,
        num_classes=args.num_classes,
        dtype=args.dtype,
        device=args.device,
        vs=args.vs,
        steps=args.steps,
        warmup=args.warmup,
        compile=args.compile,
        ref_eager=args.ref_eager,
        threads=args.threads,
        measure_peak=not args.no_peak,
        peak_size=args.peak_size,
        progress=not args.json,
        isolate=args.isolate,
        **overrides,
    )
    print(json.dumps(res.to_dict(), indent=2) if args.json else res.summary())
    return 0
