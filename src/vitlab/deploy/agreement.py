"""The agreement report of an export: the exported model run beside the original float32 model on the same
preprocessed images. Top-1 agreement, top-1 accuracy of both on labelled images, the cosine between their
logit vectors (mean, and the worst image), the largest logit difference, each model's size on disk, and
batch-1 latency / batch-32 throughput of both (medians of interleaved runs, in this process, on this
machine's threads as they are)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..evaluate.calibration import probabilities
from .check_images import CheckImages

__all__ = ["agreement", "format_report", "logits_of", "serving_table", "timings"]

_BATCH = 32


def logits_of(model: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor) -> np.ndarray:
    """``model``'s float32 logits for ``inputs``, in batches of 32."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(inputs), _BATCH):
            out.append(model(inputs[start : start + _BATCH]).float().cpu().numpy())
    return np.concatenate(out)


def agreement(
    ref: np.ndarray, got: np.ndarray, images: CheckImages, class_names: list[str], *, temperature: float = 1.0
) -> dict[str, Any]:
    """What the report says about the exported logits ``got`` against the float32 ``ref`` (both the model's own
    logits: an export's runtime gives them back from its calibrated graph), and about the probabilities both give
    ``vitlab predict``: ``softmax(logits / temperature)``, the model's calibration (the largest difference of one
    class's probability, and the same temperature on both sides)."""
    a, b = ref.argmax(1), got.argmax(1)
    cos = (ref * got).sum(1) / np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1), 1e-30)
    p_ref = probabilities(torch.from_numpy(ref), temperature).numpy()
    p_got = probabilities(torch.from_numpy(got), temperature).numpy()
    out: dict[str, Any] = {
        "images": len(a),
        "top1_agreement": float((a == b).mean()),
        "disagreements": int((a != b).sum()),
        "logit_cosine_mean": float(cos.mean()),
        "logit_cosine_min": float(cos.min()),
        "max_abs_logit_diff": float(np.abs(ref - got).max()),
        "temperature": temperature,
        "max_abs_prob_diff": float(np.abs(p_ref - p_got).max()),
    }
    known = set(class_names)
    if images.labelled and all(lab in known for lab in images.labels):
        y = np.asarray([class_names.index(lab) for lab in images.labels])
        out["top1"] = {"fp32": float((a == y).mean()), "exported": float((b == y).mean())}
    else:
        why = "no labels" if not images.labelled else "the class folders are not the model's classes"
        out["top1"] = None
        out["top1_note"] = why
    out["predictions"] = [
        {"image": n, "label": lab, "fp32": class_names[i], "exported": class_names[j]}
        for n, lab, i, j in zip(images.names, images.labels, a.tolist(), b.tolist())
    ]
    return out


def _median_seconds(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm-up: first-call allocation, weight packing, session start
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timings(
    models: dict[str, Callable[[torch.Tensor], torch.Tensor]], shape: tuple[int, ...], *, runs: int
) -> dict[str, Any]:
    """Batch-1 latency (ms, median of ``runs``) and batch-32 throughput (images/s, median of ``max(2, runs //
    4)`` runs) of each model, on random inputs of ``shape`` ``(C, H, W)``. The models take turns for each
    measure, so a change of machine load touches both."""
    g = torch.Generator().manual_seed(0)
    x1, x32 = torch.randn(1, *shape, generator=g), torch.randn(_BATCH, *shape, generator=g)
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "runs_batch1": runs, "runs_batch32": max(2, runs // 4)}
    with torch.inference_mode():
        for name, m in models.items():
            out[name] = {"latency_ms_batch1": 1e3 * _median_seconds(lambda m=m: m(x1), runs)}
        for name, m in models.items():
            out[name]["images_per_s_batch32"] = _BATCH / _median_seconds(lambda m=m: m(x32), out["runs_batch32"])
    return out


def serving_table(timing: dict[str, Any] | None) -> list[list[Any]] | None:
    """Which model of an int8 export serves a batch of each size, from the report's own measurement ``timing``
    (:func:`timings` of ``exported``, the int8 model, and ``exported_fp32``, its float32 model in the same
    runtime): ``[[1, "int8"], [32, "float32"]]`` when int8 is the faster at batch 1 and the slower at 32 (a
    batch of 2 to 31 takes the batch-1 choice: only the measured sizes decide); ``None`` when int8 is as fast or
    faster at both sizes measured (or nothing was measured): the int8 model for every batch."""
    if not timing or "exported_fp32" not in timing:
        return None
    q, f = timing["exported"], timing["exported_fp32"]
    one = "float32" if q["latency_ms_batch1"] > f["latency_ms_batch1"] else "int8"
    many = "float32" if q["images_per_s_batch32"] < f["images_per_s_batch32"] else "int8"
    if one == many == "int8":
        return None
    return [[1, one]] if one == many else [[1, one], [_BATCH, many]]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def format_report(rep: dict[str, Any]) -> list[str]:
    """The report as the lines ``vitlab export`` prints (the verdict line last)."""
    ag, size = rep["agreement"], rep["size_bytes"]
    lines = [f"  check: {rep['check_data']['description']}"]
    if (rep.get("calib_data") or {}).get("note"):
        lines.append(f"  note: {rep['calib_data']['note']}")
    lines.append(
        f"  top-1 agreement with fp32: {100 * ag['top1_agreement']:.2f}% ({ag['disagreements']} of {ag['images']} "
        f"differ); logit cosine mean {ag['logit_cosine_mean']:.5f}, min {ag['logit_cosine_min']:.5f}; "
        f"max |diff| {ag['max_abs_logit_diff']:.3g}"
    )
    if "max_abs_prob_diff" in ag:
        t = ag.get("temperature", 1.0)
        how = f"calibrated, T = {t:.3g}" if t != 1.0 else "no temperature"
        lines.append(f"  probabilities ({how}): max |diff| {ag['max_abs_prob_diff']:.3g}")
    if ag["top1"] is not None:
        lines.append(f"  top-1: fp32 {100 * ag['top1']['fp32']:.2f}%, exported {100 * ag['top1']['exported']:.2f}%")
    else:
        lines.append(f"  top-1: not measured ({ag['top1_note']})")
    f, e = size["fp32"], size["exported"]
    than = f"{f / e:.2f}x smaller" if e < f else f"{e / max(f, 1):.2f}x larger: the graph, not the weights"
    lines.append(f"  size on disk: fp32 {_mb(f)}, exported {_mb(e)} ({than})")
    t = rep.get("timing")
    if t:
        f, e = t["fp32"], t["exported"]
        lines.append(
            f"  batch 1: fp32 {f['latency_ms_batch1']:.2f} ms, exported {e['latency_ms_batch1']:.2f} ms "
            f"({_ratio(f['latency_ms_batch1'], e['latency_ms_batch1'])}); batch 32: fp32 "
            f"{f['images_per_s_batch32']:.1f} img/s, exported {e['images_per_s_batch32']:.1f} img/s "
            f"({_ratio(e['images_per_s_batch32'], f['images_per_s_batch32'])}) on {t['threads']} threads"
        )
        q = t.get("exported_fp32")
        if q:
            lines.append(
                f"  its float32 model: batch 1 {q['latency_ms_batch1']:.2f} ms, batch 32 "
                f"{q['images_per_s_batch32']:.1f} img/s (int8: {_ratio(q['latency_ms_batch1'], e['latency_ms_batch1'])}"
                f" at batch 1, {_ratio(e['images_per_s_batch32'], q['images_per_s_batch32'])} at batch 32)"
            )
    else:
        lines.append("  timing: not measured (--no-timing)")
    table = (rep.get("serving") or {}).get("by_batch")
    if table and any(kind == "float32" for _, kind in table) and rep.get("int8"):
        parts = [
            f"batches of {first}{'+' if i == len(table) - 1 else f'-{table[i + 1][0] - 1}'}: {kind}"
            for i, (first, kind) in enumerate(table)
        ]
        lines.append(
            "  serving: " + "; ".join(parts) + " (int8 measured slower there; both models kept, config.json's "
            "export.by_batch says which serves which batch)"
        )
    return lines
