"""The attention health of finished training runs side by side (issue 39; docs/analyses.md, "What the curves
show"): for each run folder, the per-layer mean attention distance at the end (the paper's Fig. 7 measure: does it
grow with depth?), each measure's extreme over the run (the largest logit's peak, the lowest entropy, the most
collapsed heads, the largest outlier ratio), top-1, and the alarms and notes its series raises under today's
thresholds, replayed epoch by epoch as the run checks them (with the first epoch each one fires). It draws one
comparison figure (per run: distance by depth at the end, the largest logit, the lowest layer entropy and top-1
against epochs) and prints a markdown table; each run's own ``health.png`` has every layer's curves.

    python benchmarks/attention_runs.py --run default=runs/c_default --run unstable=runs/c_unstable \\
        --figure docs/figures/health_cifar10.png

Everything is read from the run folders (``metrics.jsonl``, ``summary.json``, ``model/config.json``): nothing is
trained or timed here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from _common import alarm_history, health_records, named_alarms, named_notes, read_metrics

from vitlab.inspect import RunContext

MAX_JSON = 1 << 20
"""The most bytes read of a run's ``summary.json`` or model ``config.json``."""


def _json(path: Path) -> dict[str, Any]:
    """A small JSON object of a run folder ({} when it is missing, too large or not an object)."""
    if not path.is_file() or path.stat().st_size > MAX_JSON:
        return {}
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def context_of(run: Path) -> RunContext:
    """The :class:`RunContext` a run's watch had (:func:`vitlab.train.engine.watch.run_context`), from what the run
    wrote: its summary (training images, LR, warmup, planned epochs) and its model's configuration."""
    s, c = _json(run / "summary.json"), _json(run / "model" / "config.json")
    r = s.get("recipe_config") or {}
    warm = any(r.get(k) for k in ("warmup_epochs", "warmup_steps", "warmup_fraction"))
    init = (s.get("model") or {}).get("init")
    return RunContext(
        num_train_images=(s.get("data") or {}).get("train"),
        qk_norm=bool(c.get("qk_norm")),
        warmup=warm,
        reg_tokens=int(c.get("reg_tokens") or 0),
        hybrid=c.get("hybrid_layers") is not None or c.get("stem", "patch") != "patch",
        patch_size=c.get("patch_size"),
        embed_dim=c.get("embed_dim"),
        depth=c.get("depth"),
        lr=r.get("lr"),
        epochs=s.get("planned_epochs"),
        fresh=not init,
    )


Fired = dict[str, tuple[int, str]]
"""``{alarm or note: (the epoch it first fires, its sentence then)}``."""


def replay(rows: list[dict[str, Any]], ctx: RunContext) -> tuple[Fired, Fired]:
    """The alarms and the notes over the run's series, as the run's own watch checks them after each epoch (with
    the optimizer step of that epoch), in one pass."""
    alarms: Fired = {}
    notes: Fired = {}
    watched = [r for r in rows if isinstance(r.get("attention"), dict)]  # the rows health_records keeps, in order
    history = alarm_history(watched)
    for i, (epoch, _) in enumerate(health_records(watched)):
        step = watched[i].get("step")
        now = dataclasses.replace(ctx, steps=step if isinstance(step, int) else None)
        for fired, named in ((alarms, named_alarms), (notes, named_notes)):
            for name, msg in named(history[: i + 1], context=now):
                fired.setdefault(name, (epoch, msg))
    return alarms, notes


def summarise(label: str, run: Path) -> dict[str, Any]:
    """One run's row: its final per-layer distance over the uniform one, the extremes, top-1 and the alarms."""
    rows = read_metrics(run / "metrics.jsonl")
    recs = health_records(rows)
    if not recs:
        raise SystemExit(f"error: {run}/metrics.jsonl has no attention-health records (--watch-attention off?)")
    last = recs[-1][1]
    uniform = last.get("uniform_distance") or float("nan")

    def extreme(key: str, pick: Any) -> tuple[float, int]:
        """The extreme value of a per-layer measure over every record, and its (1-based) layer."""
        vals = [(v, i + 1) for _, r in recs for i, v in enumerate(r.get(key) or []) if isinstance(v, (int, float))]
        return pick(vals) if vals else (float("nan"), 0)

    top1 = [r.get("top1") for r in rows if isinstance(r.get("top1"), (int, float))]
    alarms, notes = replay(rows, context_of(run))
    return {
        "label": label,
        "run": str(run),
        "epochs": len(recs),
        "steps": rows[-1].get("step"),
        "top1": top1[-1] if top1 else None,
        "grid": last.get("grid"),
        "uniform_distance": uniform,
        "distance_last": last.get("distance"),
        "distance_min_last": last.get("distance_min"),
        "max_logit_peak": extreme("max_logit", max),
        "entropy_low": extreme("entropy", min),
        "collapsed_peak": extreme("collapsed_fraction", max),
        "outlier_peak": extreme("outlier_ratio", max),
        "alarms": alarms,
        "notes": notes,
        "series": [(ep, r) for ep, r in recs],
        "top1_series": [(r.get("epoch"), r.get("top1")) for r in rows if isinstance(r.get("top1"), (int, float))],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`summarise`'s rows."""
    out = [
        "| run | epochs | top-1 | distance by layer, end (px; uniform) | peak logit (layer) | lowest entropy "
        "(layer) | outlier peak | alarms; notes (first epoch) |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        dist = " / ".join(f"{v:.1f}" for v in r["distance_last"] or [])
        logit, ent, outl = r["max_logit_peak"], r["entropy_low"], r["outlier_peak"]
        said = [f"{k.replace('_', ' ')} ({ep})" for k, (ep, _) in r["alarms"].items()] or ["none"]
        said += [f"note: {k.replace('_', ' ')} ({ep})" for k, (ep, _) in r["notes"].items()]
        alarms = "; ".join(said)
        top1 = f"{100 * r['top1']:.2f}%" if r["top1"] is not None else "-"
        out.append(
            f"| {r['label']} | {r['epochs']} | {top1} | {dist} ({r['uniform_distance']:.1f}) | {logit[0]:.1f} "
            f"({logit[1]}) | {ent[0]:.2f} ({ent[1]}) | {outl[0]:.1f} | {alarms} |"
        )
    return "\n".join(out)


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    """Four panels, one curve per run: distance over uniform by depth at the end (Fig. 7's measure), the largest
    logit (over layers) and the lowest layer entropy against epochs, and top-1 against epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for r in rows:
        u = r["uniform_distance"]
        dist = r["distance_last"] or []
        (line,) = axes[0].plot(range(1, len(dist) + 1), [v / u for v in dist], marker="o", label=r["label"])
        eps = [ep for ep, _ in r["series"]]
        logit = [max((v for v in rec.get("max_logit") or [] if v is not None), default=None) for _, rec in r["series"]]
        ent = [min((v for v in rec.get("entropy") or [] if v is not None), default=None) for _, rec in r["series"]]
        axes[1].plot(eps, logit, color=line.get_color())
        axes[2].plot(eps, ent, color=line.get_color())
        axes[3].plot(*zip(*r["top1_series"]), color=line.get_color())
    axes[0].axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes[0].set(title="mean attention distance at the end", xlabel="layer", ylabel="/ uniform attention's")
    axes[1].set(title="largest attention logit (any layer)", xlabel="epoch", yscale="log")
    axes[2].set(title="lowest layer entropy (nats)", xlabel="epoch")
    axes[3].set(title="top-1", xlabel="epoch")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", action="append", required=True, metavar="LABEL=DIR", help="a run folder (repeatable)")
    p.add_argument("--figure", default=None, help="the comparison figure (PNG)")
    p.add_argument("--json", default=None, help="the rows as JSON (without the series)")
    a = p.parse_args(argv)
    rows = []
    for spec in a.run:
        label, sep, folder = spec.partition("=")
        if not sep or not folder:
            p.error(f"--run takes LABEL=DIR, got {spec!r}")
        rows.append(summarise(label, Path(folder)))
    print(table(rows))
    for r in rows:
        for kind in ("alarms", "notes"):
            for ep, msg in r[kind].values():
                print(f"- {r['label']}, epoch {ep}: {'note: ' if kind == 'notes' else ''}{msg}")
    if a.figure:
        figure(rows, Path(a.figure))
    if a.json:
        keep = [{k: v for k, v in r.items() if k not in ("series", "top1_series")} for r in rows]
        Path(a.json).write_text(json.dumps(keep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
