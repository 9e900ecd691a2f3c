"""Deployment on a CPU: speed and agreement of every export path, with and without token merging.

Rows, for each model and each token-merging rate r (0 and the two of --tome): timm eager fp32 (r = 0 only:
timm has no token merging), vitlab eager fp32, ONNX Runtime fp32, ORT int8 dynamic, ORT int8 static
(calibrated on --calib-data), torch int8 dynamic (vitlab's Int8Linear). Columns: batch-1 latency (median of --runs
calls) and batch-32 throughput (median of max(2, runs // 4) calls), the rows taking turns for each measure;
top-1 agreement and mean logit cosine with vitlab eager fp32 at r = 0 on --check-data (generated images
without it), top-1 on labelled check data, size on disk. Run it alone on the machine (docs/deploy.md):

    # speed: random weights at 224 (the head drawn N(0, 0.02) so the logits are not all zero)
    python benchmarks/bench_deploy.py --models vit_s16,vit_b16 --tome 8,16 --runs 20 --out deploy_speed.json
    # accuracy: a trained vitlab folder, photos
    python benchmarks/bench_deploy.py --models RUN/model --tome 8,16 --check-data PHOTOS/test \\
        --calib-data PHOTOS/train --out deploy_accuracy.json
    # CI: a tiny model, every row, a few seconds per row
    python benchmarks/bench_deploy.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import (
    export_model,
    folder_images,
    generated_images,
    int8_state,
    logits_of,
    ort_dynamic,
    ort_static,
    resolve_model,
    timings,
    torch_dynamic,
)

from vitlab import VitlabError
from vitlab.accel import accelerate
from vitlab.bench import build_reference
from vitlab.models import VisionTransformer

SMOKE = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)


class OrtModel:
    """An onnxruntime session called like a model: ``(N, C, H, W)`` tensor -> logits tensor."""

    def __init__(self, path: Path, threads: int | None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        self.bytes = path.stat().st_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        arr = np.ascontiguousarray(x.numpy(), dtype=np.float32)
        return torch.from_numpy(self.session.run(["logits"], {"pixel_values": arr})[0])


def _float_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values() if isinstance(t, torch.Tensor))


def _load(spec: str) -> VisionTransformer:
    if spec == "smoke":
        model = VisionTransformer(**SMOKE)
    else:
        model, _ = resolve_model(spec)
    if Path(spec).exists():
        return model.eval()
    torch.manual_seed(0)
    torch.nn.init.normal_(model.head.weight, std=0.02)  # random weights: logits that are not all zero
    return model.eval()


def rows_for(model: VisionTransformer, r: int, tmp: Path, calib: np.ndarray, threads: int | None) -> dict[str, Any]:
    """Every deployment of ``model`` at token-merging rate ``r``: row name -> (callable, bytes on disk)."""
    merged = copy.deepcopy(model).set_tome(r)
    rows: dict[str, Any] = {}
    if r == 0:
        try:
            timm_model = build_reference("timm", model.config).eval()
            timm_model.load_state_dict(model.state_dict())
            rows["timm eager fp32"] = (timm_model, _float_bytes(model))
        except (VitlabError, RuntimeError) as e:  # no timm twin (another posemb, head ...), or names that differ
            print(f"# timm eager fp32: no row ({str(e).splitlines()[0]})")
    rows["vitlab eager fp32"] = (accelerate(copy.deepcopy(merged)).eval(), _float_bytes(model))
    fp32 = tmp / f"r{r}-fp32.onnx"
    export_model(merged, fp32, format="onnx", overwrite=True)
    ort_dynamic(fp32, tmp / f"r{r}-dyn.onnx")
    ort_static(fp32, tmp / f"r{r}-static.onnx", calib)
    for name, f in (("ORT fp32", fp32), ("ORT int8 dynamic", "dyn"), ("ORT int8 static", "static")):
        m = OrtModel(f if isinstance(f, Path) else tmp / f"r{r}-{f}.onnx", threads)
        rows[name] = (m, m.bytes)
    q = torch_dynamic(merged)
    rows["torch int8 dynamic"] = (q, sum(t.numel() * t.element_size() for t in int8_state(q).values()))
    return rows


def bench_model(spec: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    model = _load(spec)
    label = "smoke" if spec == "smoke" else spec
    if args.check_data:
        check = folder_images(model, args.check_data, limit=args.check_limit, flag="--check-data")
    else:
        check = generated_images(model, 16 if args.smoke else 64)
    if args.calib_data:
        calib = folder_images(model, args.calib_data, limit=args.calib_limit, flag="--calib-data").inputs
    else:  # (speed rows only: ranges from generated images are no basis for accuracy)
        calib = generated_images(model, 16 if args.smoke else 64, seed=1).inputs
    names = list(model.config.class_names or [str(i) for i in range(model.config.num_classes)])
    y = (
        np.asarray([names.index(lab) for lab in check.labels])
        if check.labelled and set(check.labels) <= set(names)
        else None
    )
    with torch.inference_mode():
        ref = logits_of(accelerate(copy.deepcopy(model)).eval(), check.inputs)
    out = []
    with tempfile.TemporaryDirectory() as d:
        for r in [0, *args.tome]:
            rows = rows_for(model, r, Path(d), calib.numpy(), args.threads)
            shape = (model.config.in_chans, *model.config.img_size)
            timed = timings({k: v[0] for k, v in rows.items()}, shape, runs=args.runs)
            for name, (m, size) in rows.items():
                got = logits_of(m, check.inputs)
                cos = (ref * got).sum(1) / np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1), 1e-30)
                out.append(
                    {
                        "model": label,
                        "row": name,
                        "tome_r": r,
                        "latency_ms_batch1": timed[name]["latency_ms_batch1"],
                        "images_per_s_batch32": timed[name]["images_per_s_batch32"],
                        "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
                        "logit_cosine_mean": float(cos.mean()),
                        "top1": None if y is None else float((got.argmax(1) == y).mean()),
                        "size_bytes": int(size),
                        "threads": timed["threads"],
                    }
                )
                print(_line(out[-1]), flush=True)
    return out


def _line(row: dict[str, Any]) -> str:
    top1 = "-" if row["top1"] is None else f"{100 * row['top1']:.2f}%"
    return (
        f"| {row['model']} | {row['row']} | {row['tome_r']} | {row['latency_ms_batch1']:.2f} | "
        f"{row['images_per_s_batch32']:.1f} | {100 * row['top1_agreement']:.2f}% | {row['logit_cosine_mean']:.4f} | "
        f"{top1} | {row['size_bytes'] / 1e6:.1f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_s16,vit_b16", help="registered names (random weights) or folders")
    ap.add_argument("--tome", default="8,16", help="the two token-merging rates (r = 0 always runs)")
    ap.add_argument("--runs", type=int, default=20, help="batch-1 calls per row (batch 32: a quarter)")
    ap.add_argument("--threads", type=int, default=None, help="threads for torch and onnxruntime (default: theirs)")
    ap.add_argument("--check-data", default=None, metavar="DIR")
    ap.add_argument("--check-limit", type=int, default=500)
    ap.add_argument("--calib-data", default=None, metavar="DIR")
    ap.add_argument("--calib-limit", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, r = 1 and 2, 2 runs: checks every row runs")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    args = ap.parse_args()
    if args.smoke:
        args.models, args.tome, args.runs = "smoke", "1,2", 2
    args.tome = [int(v) for v in args.tome.split(",") if v]
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# load average at start: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    print("| model | row | ToMe r | batch 1 (ms) | batch 32 (img/s) | top-1 agreement | logit cosine | top-1 | MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [row for spec in args.models.split(",") for row in bench_model(spec, args)]
    print(f"# load average at end: {os.getloadavg()}")
    if args.out:
        body = {"command": "python " + " ".join(sys.argv), "rows": rows}
        Path(args.out).write_text(json.dumps(body, indent=2) + "\n")


if __name__ == "__main__":
    main()
