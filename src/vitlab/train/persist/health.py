"""The attention-health records of a run (issue 39) as they live in ``metrics.jsonl``: each epoch's row holds
``row["attention"]``, a compact form of :func:`vitlab.inspect.attention_health`'s record (per-layer lists, 4
significant digits); this module writes that form (:func:`compact`) and reads it back for the alarms
(:func:`alarm_history`), the figure, the trackers (:func:`row_scalars`) and the end-of-run advice
(:func:`with_alarms`). Rows are data read back from a file: a missing or malformed record is skipped."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LAYER_MEASURES", "alarm_history", "compact", "health_records", "row_scalars", "with_alarms"]

LAYER_MEASURES = ("distance", "entropy", "collapsed_fraction", "max_logit", "outlier_ratio")
"""The per-layer measures a row keeps (the keys of :func:`vitlab.inspect.attention_health`), in this order."""


def _round(v: Any) -> float | None:
    """``v`` to 4 significant digits; None for what is not a finite number."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(f"{v:.4g}") if ok else None


def compact(record: Mapping[str, Any], *, seconds: float) -> dict[str, Any]:
    """What a ``metrics.jsonl`` row keeps of an :func:`~vitlab.inspect.attention_health` ``record``: the per-layer
    :data:`LAYER_MEASURES`, the nearest head's distance per layer (``distance_min``: all that the no-local-heads
    alarm reads of the per-head distances), the scales (``uniform_distance``, ``max_entropy``,
    ``collapse_threshold``), the grid, heads and images, and the pass's ``seconds``."""
    out: dict[str, Any] = {k: [_round(v) for v in record[k]] for k in LAYER_MEASURES}
    per_head = record["distance_per_head"]
    out["distance_min"] = [_round(min((v for v in row if v is not None), default=math.nan)) for row in per_head]
    for k in ("uniform_distance", "max_entropy", "collapse_threshold"):
        out[k] = _round(record[k])
    out.update(grid=list(record["grid"]), heads=record["heads"], images=record["num_images"])
    out["seconds"] = _round(seconds)
    return out


def health_records(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """``[(epoch, record)]``: the rows' attention-health records, oldest first (rows without one are skipped)."""
    out = []
    for i, r in enumerate(rows):
        rec = r.get("attention") if isinstance(r, Mapping) else None
        if isinstance(rec, dict):
            ep = r.get("epoch")
            out.append((ep if isinstance(ep, int) and not isinstance(ep, bool) else i + 1, rec))
    return out


def alarm_history(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records as :func:`vitlab.inspect.health_alarms` reads them: ``distance_per_head`` is each layer's
    nearest head (the alarm asks whether any head of the early layers is local)."""
    out = []
    for _, rec in health_records(rows):
        near = rec.get("distance_min")
        per_head = [[v] for v in near] if isinstance(near, list) else None
        out.append({**rec, "distance_per_head": per_head})
    return out


def row_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """A ``metrics.jsonl`` row as the trackers' scalars: its numbers (``epoch`` and ``step`` aside: the step is
    where they are logged) and the attention health per layer, ``attention/<measure>/layer<i>`` (from 1), plus
    ``attention/seconds``. Values that are not finite numbers are left out."""
    out: dict[str, float] = {}
    for k, v in row.items():
        if k not in ("epoch", "step") and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    rec = row.get("attention")
    if isinstance(rec, Mapping):
        for m in LAYER_MEASURES:
            values = rec.get(m)
            for i, v in enumerate(values if isinstance(values, list) else []):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out[f"attention/{m}/layer{i + 1}"] = float(v)
        if isinstance(rec.get("seconds"), (int, float)):
            out["attention/seconds"] = float(rec["seconds"])
    return out


def with_alarms(line: str | None, alarms: Sequence[str], notes: Sequence[str] = ()) -> str | None:
    """The end-of-run advice ``line`` (or None) followed by one ``advice: <alarm>`` line per attention alarm and
    one ``note: <note>`` line per attention note."""
    lines = ([line] if line else []) + [f"advice: {a}" for a in alarms] + [f"note: {n}" for n in notes]
    return "\n".join(lines) or None
