"""``benchmarks/`` is a set of scripts on vitlab's public API, not a second codebase (issue 57): each script imports
vitlab's public names, its one shared module ``_common`` and nothing of another script; none edits ``sys.path``;
each times through ``vitlab.bench`` (or, for a whole run, ``_common.Stopwatch``); vitlab's names that are not public
yet are named in ``_common.NOT_PUBLIC`` only, and each still resolves (a refactor that moves one fails here, in one
place)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from benchscripts import BENCH, SHARED, load, shared

SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.stem != SHARED)
CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns", "process_time"}
"""``time``'s clocks: a script that reads one times something with a loop of its own."""


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _public(module: str) -> set[str]:
    """The public names of ``vitlab`` or of one of its packages or modules: its ``__all__`` (``vitlab.cli``, which has
    none, its names without a leading underscore)."""
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    return set(names) if names is not None else {n for n in vars(mod) if not n.startswith("_")}


def _offences(path: Path) -> list[str]:
    """Every import of ``path`` that is not vitlab's public API, a third party's, the standard library's or
    ``_common``'s, with its line."""
    scripts = {p.stem for p in BENCH.glob("*.py")} - {SHARED}
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("vitlab.") or a.name.split(".")[0] in scripts:
                    out.append(f"{path.name}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [a.name for a in node.names]
            if node.level or mod.split(".")[0] in scripts:
                out.append(f"{path.name}:{node.lineno}: from {'.' * node.level}{mod} import (another script)")
            elif mod == SHARED:
                out += [f"{path.name}:{node.lineno}: _common has no {n}" for n in names if not hasattr(shared(), n)]
            elif mod == "vitlab" or mod.startswith("vitlab."):
                parts = mod.split(".")
                if len(parts) > 2 or parts[-1].startswith("_") or mod == "vitlab.commands":
                    out.append(f"{path.name}:{node.lineno}: from {mod} import {', '.join(names)} (not public)")
                    continue
                hidden = [n for n in names if n not in _public(mod)]
                if hidden:
                    out.append(f"{path.name}:{node.lineno}: from {mod} import {', '.join(hidden)} (not in __all__)")
    return out


def test_scripts_import_vitlabs_public_names_their_shared_module_and_no_other_script() -> None:
    offences = [o for p in SCRIPTS for o in _offences(p)]
    assert not offences, "take it from benchmarks/_common.py (NOT_PUBLIC) or vitlab's public API:\n" + "\n".join(
        offences
    )


def test_no_script_edits_sys_path() -> None:
    """``python benchmarks/NAME.py`` finds ``_common`` by itself (the script's folder comes first on the path)."""
    found = []
    for p in [*SCRIPTS, BENCH / f"{SHARED}.py"]:
        for node in ast.walk(_tree(p)):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                found.append(f"{p.name}:{node.lineno}")
    assert not found, found


def test_scripts_time_through_vitlab_bench_or_the_shared_stopwatch() -> None:
    """No script reads a clock of its own: a step or a call is timed by ``vitlab.bench`` (``benchmark``,
    ``time_calls``), a whole run by ``_common.Stopwatch``."""
    found = []
    for p in SCRIPTS:
        for node in ast.walk(_tree(p)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in CLOCKS
                and isinstance(node.value, ast.Name)
                and node.value.id == "time"
            ):
                found.append(f"{p.name}:{node.lineno}: time.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "time":
                found += [f"{p.name}:{node.lineno}: from time import {a.name}" for a in node.names if a.name in CLOCKS]
    assert not found, found


def test_every_name_not_yet_public_resolves_and_is_used() -> None:
    """``_common.NOT_PUBLIC`` is the one place that names vitlab's internals: each still resolves, and each is
    used by a script (so the list the lead replaces by public functions is exact)."""
    common = shared()
    used: set[str] = set()
    for p in SCRIPTS:
        for node in ast.walk(_tree(p)):
            if isinstance(node, ast.ImportFrom) and node.module == SHARED:
                used |= {a.name for a in node.names}
    for name, (module, attr) in common.NOT_PUBLIC.items():
        found = importlib.import_module(module)
        assert attr is None or hasattr(found, attr), f"{module}.{attr} is gone: update _common.NOT_PUBLIC"
        assert getattr(common, name) is (found if attr is None else getattr(found, attr))
    assert set(common.NOT_PUBLIC) <= used, set(common.NOT_PUBLIC) - used
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        common.nope  # noqa: B018


@pytest.mark.parametrize("script", [p.stem for p in SCRIPTS])
def test_every_script_loads_without_running(script: str) -> None:
    """Importing a script runs nothing (its work is under ``if __name__ == "__main__"``) and every name it imports
    at the top exists."""
    mod = load(script)
    assert callable(getattr(mod, "main", None)), f"{script}.py has no main()"


# -- the timing loops that moved to vitlab.bench.time_calls, run on tiny inputs (their rows, never their numbers) ----


def test_packed_attention_times_every_method_each_round() -> None:
    import torch

    bench = load("bench_packed_attention")
    segs = bench.segments(16, 2, 2, 6)
    ctx = bench.context(segs, 16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 4, generator=g) for _ in range(3))
    methods = {m: bench.METHODS[m] for m in ("split", "mask", "padded")}
    times = bench.passes(methods, q, k, v, ctx, rounds=2)
    assert list(times) == ["split", "mask", "padded"]
    for m in methods:
        assert len(times[m]["fwd"]) == len(times[m]["bwd"]) == 2 and all(t > 0 for t in times[m]["fwd"])
    assert q.grad is None  # the backward passes ran on fresh copies


@pytest.mark.parametrize(
    ("script", "argv", "says"),
    [
        ("bench_cpu_inference", ["vit_ti16", "1", "1"], "| both off (aten) |"),
        ("bench_scaling", ["--models", "vit_ti16", "--sizes", "32", "--batch-size", "1", "--steps", "1"], '"tokens"'),
        ("bench_export", ["--model", "vit_ti16", "--batch-size", "1", "--steps", "1"], "onnxruntime / pytorch:"),
        ("bench_checkpoint_save", ["--models", "tiny (auto)", "--rounds", "1"], "| tiny (auto) | 556,298 | 7 MB |"),
    ],
)
def test_scripts_without_a_smoke_mode_print_their_rows(script: str, argv: list[str], says: str, monkeypatch, capsys):
    if script == "bench_export":
        pytest.importorskip("onnxruntime")
    bench = load(script)
    monkeypatch.setattr("sys.argv", [f"{script}.py", *argv])
    bench.main()
    out = capsys.readouterr().out
    assert says in out and "# load average at end" in out, out


def test_the_replan_replay_feeds_generated_paces_to_the_re_planner(monkeypatch, capsys):
    """``replan_replay.py --synthetic`` replays every generated machine through the re-planner on a clock of its own
    (nothing timed) and ends every run on its budget (seed 0 of the half-hour machine that doubles its speed at 40% of
    it ended 8.7 s past it before ``budget.FINAL``, in 9 moves; the one slowed from 30 to 60% of it now makes 13, one
    more, and ends 10.9 s earlier); the module's clock is the real one again after."""
    import time

    bench = load("replan_replay")
    monkeypatch.setattr("sys.argv", ["replan_replay.py", "--synthetic", "--seeds", "1"])
    bench.main()
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and " s |" in r]
    assert len(rows) == len(bench.MACHINES) * len(bench.KINDS), rows
    for row in rows:
        budget, _, moves, ends = (c.strip() for c in row.strip("|").split("|"))
        least, most = (float(v) for v in ends.split(" - "))
        assert int(moves) <= 13 and 0.9 * float(budget[:-2]) < least <= most <= float(budget[:-2]), row
    assert shared().sizing_budget.time is time
