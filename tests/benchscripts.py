"""The scripts of ``benchmarks/`` as modules, for the tests: ``load("speedrun")`` is ``benchmarks/speedrun.py`` loaded
by its path, its shared helper ``benchmarks/_common.py`` importable as ``_common`` as it is when the script runs
(``python benchmarks/NAME.py`` puts the script's folder first on ``sys.path``). ``benchmarks/`` is never added to
``sys.path``: no script can import another by accident here either. Import it with ``from benchscripts import load``
(pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SHARED = "_common"


def _exec(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def shared() -> ModuleType:
    """``benchmarks/_common.py``, registered as ``_common`` (once)."""
    mod = sys.modules.get(SHARED)
    if mod is not None and Path(getattr(mod, "__file__", "")).resolve() == BENCH / f"{SHARED}.py":
        return mod
    return _exec(SHARED, BENCH / f"{SHARED}.py")


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a fresh module named ``benchmarks_<name>`` (its ``main`` not run)."""
    shared()
    return _exec(f"benchmarks_{name}", BENCH / f"{name}.py")
