"""The layout's rules, checked on the source: the import graph of ``src/vitlab`` (every import, at module level
and inside functions; relative imports resolved; ``from pkg import name`` counts ``pkg.name`` when that is a
module) has no cycle, and the directions hold: ``models/`` imports nothing of vitlab but errors; ``accel/`` is
imported by its allowed callers only; ``train/`` never imports ``commands/``; ``train/conf`` never imports torch;
``train/conf``, ``objectives`` and ``persist`` never import ``train/engine``. Imports under ``if TYPE_CHECKING:`` are
left out of the graph of what runs: they never run; but every import, theirs included, must name a module that
exists, and no circle may close through them either (a typing-only circle is a knot the next refactor trips on).
Imports of vitlab modules inside functions of ``train/`` stay few, each with a ``# lazy: <reason>`` comment.

``train/sizing`` (how much a run gets) sits between the engine and the configuration: ``engine -> sizing -> conf``,
never back; the objectives and the run's outputs reach it by name
(:func:`~vitlab.train.conf.train_config.objective_name`), never by import from below; and its rule modules import
no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ACCEL_CALLERS = {
    "vitlab",  # create_model / load: the public API with the speed paths
    "vitlab.bench",  # ours against the references
    "vitlab.commands",  # a model argument served fast (eval, predict, few-shot)
    "vitlab.deploy",  # the exported graph's own runtime
    "vitlab.resolve",  # the one model rule: a model argument served fast (eval, predict, a teacher)
    "vitlab.train.engine.model",  # the model a run trains
    "vitlab.train.sizing.probe",  # the probes time the run's candidates as the run will train them
}
"""Packages (and modules) whose modules may import :mod:`vitlab.accel`: the one-way seam's callers."""
MAX_LAZY_IN_TRAIN = 15


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted((SRC / "vitlab").rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, *, in_function: bool = False, typing: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every import statement with whether it sits inside a function; ``if TYPE_CHECKING:`` blocks skipped (with
    ``typing``: walked too)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node) and not typing:
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]), in_function=in_function)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _imports(node, in_function=inner, typing=typing)


def _targets(module: str, node: ast.AST) -> list[str]:
    """The modules an import statement of ``module`` loads (vitlab's and third parties', by name)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        pkg = ".".join(base + ([node.module] if node.module else []))
    else:
        pkg = node.module or ""
    subs = [f"{pkg}.{a.name}" for a in node.names]
    mods = [s for s in subs if s in MODULES]
    return mods + ([pkg] if len(mods) < len(subs) else [])


def _owner(name: str) -> str | None:
    """The vitlab module ``name`` is (or is inside), or None for a third party's."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph(*, typing: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        graph[module] = {
            owner
            for node, _ in _imports(tree, typing=typing)
            for t in _targets(module, node)
            if (owner := _owner(t)) is not None and owner != module
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


GRAPH = _graph()
TYPING_GRAPH = _graph(typing=True)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_no_circle_closes_through_typing_only_imports() -> None:
    assert _cycles(TYPING_GRAPH) == []


def test_every_import_names_a_module_that_exists() -> None:
    """Every import of a vitlab module (``TYPE_CHECKING`` ones too, which never run and so never fail) names a
    module, or a name of a package or module, that exists."""
    missing = []
    for module, path in MODULES.items():
        for node, _ in _imports(ast.parse(path.read_text()), typing=True):
            for t in _targets(module, node):
                if t.startswith("vitlab") and t not in MODULES:
                    missing.append(f"{module}:{node.lineno} {t}")
    assert missing == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_models_import_nothing_of_vitlab_but_errors() -> None:
    bad = {
        m: sorted(d for d in deps if not _inside(d, "vitlab.models") and d not in ("vitlab.errors", "vitlab"))
        for m, deps in GRAPH.items()
        if _inside(m, "vitlab.models")
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_accel_is_imported_by_its_callers_only() -> None:
    bad = {
        m
        for m, deps in GRAPH.items()
        if any(_inside(d, "vitlab.accel") for d in deps)
        and not _inside(m, "vitlab.accel")
        and not any(_inside(m, c) if c != "vitlab" else m == "vitlab" for c in ACCEL_CALLERS)
    }
    assert bad == set()


@pytest.mark.parametrize(
    ("room", "never"),
    [
        ("vitlab.train", "vitlab.commands"),
        ("vitlab.train.conf", "vitlab.train.engine"),
        ("vitlab.train.objectives", "vitlab.train.engine"),
        ("vitlab.train.persist", "vitlab.train.engine"),
        ("vitlab.train.conf", "vitlab.train.objectives"),
        ("vitlab.train.conf", "vitlab.train.persist"),
        ("vitlab.train.conf", "vitlab.train.sizing"),
        ("vitlab.train.sizing", "vitlab.train.engine"),
        ("vitlab.train.sizing", "vitlab.train.objectives"),
        ("vitlab.train.sizing", "vitlab.train.persist"),
        ("vitlab.train.objectives", "vitlab.train.sizing"),
    ],
)
def test_one_direction_between_the_rooms(room: str, never: str) -> None:
    bad = {m: sorted(d for d in deps if _inside(d, never)) for m, deps in GRAPH.items() if _inside(m, room)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_conf_imports_no_torch() -> None:
    """Statically (no module of train/conf imports torch) and when it runs (importing it loads no torch)."""
    static = {
        m
        for m, path in MODULES.items()
        if _inside(m, "vitlab.train.conf")
        for node, _ in _imports(ast.parse(path.read_text()))
        for t in _targets(m, node)
        if t == "torch" or t.startswith("torch.")
    }
    assert static == set()
    code = "import sys, vitlab.train.conf.rules, vitlab.train.conf.parser; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


SIZING_RULES = ("recipe", "finetune", "levels", "side", "pace", "capacity", "steps", "choice")
"""The rule modules of ``train/sizing`` (what is chosen, from what the probes measure): no torch."""


def test_the_sizing_rules_import_no_torch() -> None:
    """Statically (no rule module imports torch at its top) and when it runs (importing them loads no torch)."""
    rules = [f"vitlab.train.sizing.{name}" for name in SIZING_RULES]
    static = {
        m
        for m in rules
        for node, in_function in _imports(ast.parse(MODULES[m].read_text()))
        if not in_function
        for t in _targets(m, node)
        if t == "torch" or t.startswith("torch.")
    }
    assert static == set()
    code = f"import sys, {', '.join(rules)}; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_few_lazy_imports_in_train_each_with_its_reason() -> None:
    lazy = []
    for m, path in MODULES.items():
        if not _inside(m, "vitlab.train"):
            continue
        lines = path.read_text().splitlines()
        for node, in_function in _imports(ast.parse(path.read_text())):
            if in_function and any(_owner(t) for t in _targets(m, node)):
                lazy.append((m, node.lineno, lines[node.lineno - 1]))
    assert len(lazy) <= MAX_LAZY_IN_TRAIN, lazy
    assert [x for x in lazy if "# lazy: " not in x[2]] == []


SAME_NAME = {
    "export.py": "the command `vitlab export` and the library's one-file export (vitlab.export)",
    "fewshot.py": "the command `vitlab fewshot` and the few-shot evaluation it runs",
    "finetune.py": "the command `vitlab finetune` and the fine-tune recipe rule it is sized by",
    "figures.py": "the figures a run draws and those `vitlab inspect` draws (matplotlib)",
    "health.py": "attention health measured (inspect) and its history while a model trains (persist)",
    "mpp.py": "masked patch prediction: its colour head (models) and its objective (train)",
    "navit.py": "NaViT's packing in each room: the options (conf), the input pipeline (data), the loaders (engine)",
    "vit.py": "the ViT (models) and its fast path (accel)",
}
"""Module file names that more than one package uses, each for one job seen from two rooms. Any other shared
name is two unrelated jobs under one name (before: three ``native.py``, two ``report.py``, ``result.py``)."""


def test_no_two_modules_share_a_file_name_for_unrelated_jobs() -> None:
    names: dict[str, list[str]] = {}
    for m, path in MODULES.items():
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(m)
    shared = {name for name, mods in names.items() if len(mods) > 1}
    assert shared == set(SAME_NAME), {n: names.get(n) for n in shared ^ set(SAME_NAME)}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    """Calls of a function named ``name`` (``name(...)`` or ``x.name(...)``) under ``tree``."""
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)) == name
    ]


def test_a_micro_batch_is_computed_in_one_place() -> None:
    """The even split of a batch over processes and accumulation steps (``micro_batch``) has one caller,
    ``BatchSplit.asked``: the run's memory fit and ``vitlab plan`` both split a batch there (six sites when #57 was
    filed, two before this test)."""
    calls, where = 0, set()
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        calls += len(_calls(tree, "micro_batch"))
        where |= {(m, f.name) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and _calls(f, "micro_batch")}
    assert (calls, where) == (1, {("vitlab.train.sizing.capacity", "asked")})


def test_the_engine_stays_a_loop() -> None:
    """#57: the engine runs what the sizing room and the configuration decided, in at most 15 files of at most 380
    lines (the issue's target). A decision that grows the engine past it belongs in ``train/sizing`` or in the data
    it is made on (the evaluation split's facts are ``DataSplits`` fields, not derived again in
    ``engine/run_data.py``, whose lines went to 389 when they were)."""
    files = sorted((SRC / "vitlab" / "train" / "engine").glob("*.py"))
    long = {f.name: n for f in files if (n := len(f.read_text().splitlines())) > 380}
    assert len(files) <= 15 and long == {}, (len(files), long)
