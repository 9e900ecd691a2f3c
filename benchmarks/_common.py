"""What the scripts of ``benchmarks/`` share, in one place: every script imports vitlab's public API, this module, and
nothing of another script.

How a script imports it: ``from _common import ...``. ``python benchmarks/NAME.py`` puts the script's own folder
first on ``sys.path``, so ``_common`` is this file; no script touches ``sys.path``. The tests load a script by its path
through ``tests/benchscripts.py``, which registers this module as ``_common`` first.

Three parts:

1. **The clock of a whole run** (:class:`Stopwatch`): the wall time of a training command, a budget's deadline. A
   model's step, or any call measured for its speed, is timed by :mod:`vitlab.bench` (:func:`~vitlab.bench.benchmark`,
   :func:`~vitlab.bench.time_calls`), never by a loop of a script's own.
2. **What several scripts build alike**: the CIFAR training step of the targets, photo-like pixels, a photo folder's
   links, the tiny data of the speedrun's smoke runs, the speedrun's ``vit`` model in timm's keywords.
3. **The names of vitlab that are not public yet** and that the scripts still need (:data:`NOT_PUBLIC`):
   ``vitlab.train``'s internals, the command-line model rule, one-file export, deployment's pieces, the per-path
   switches of ``vitlab.accel``. Only this file names them (``tests/test_bench_scripts.py`` keeps it so): when vitlab
   moves one, this table changes, not the scripts. Each row says which script uses it and what public function
   would serve it.
"""

from __future__ import annotations

import contextlib
import importlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# -- 3. names that are not public yet ---------------------------------------------------------------------------------

NOT_PUBLIC: dict[str, tuple[str, str | None]] = {
    # bench_photo_pipeline.py: the run's own pipeline piece by piece (a public `vitlab.train` function that prepares
    # a run, its data, loaders, model and one timed step without training it would serve all of these)
    "batches": ("vitlab.data.pipeline.loading", "batches"),  # the batches of a loader, as a run's loop iterates them
    "time_steps": ("vitlab.train.sizing.probe", "time_steps"),  # the run's own step-time probe
    "load_run_data": ("vitlab.train.engine.run_data", "load_run_data"),  # the folder decoded as the run decodes it
    "FolderLoaders": ("vitlab.train.engine.loaders", "FolderLoaders"),  # the run's training loaders
    "build_folder_loaders": ("vitlab.train.engine.loaders", "build_folder_loaders"),
    "amp": ("vitlab.train.engine.model", "amp"),  # the run's autocast dtype
    "build_net": ("vitlab.train.engine.model", "build_net"),  # the run's model
    "run_model_config": ("vitlab.train.engine.model", "run_model_config"),  # the run's architecture, before the model
    "build_optimizer": ("vitlab.train.engine.optim", "build_optimizer"),  # the recipe's optimizer
    "Objective": ("vitlab.train.objectives", "Objective"),
    "build_objective": ("vitlab.train.objectives", "build_objective"),
    "recipe_for": ("vitlab.train.sizing", "recipe_for"),  # the recipe a run fits to the data
    "sizing_choose": ("vitlab.train.sizing", "choose"),  # what a run gets here: threads, workers, batch
    "sizing_here": ("vitlab.train.sizing", "Here"),  # where a run is sized
    "build_config": ("vitlab.train.conf.train_config", "build_config"),  # a TrainConfig from `vitlab train` flag values
    "LEVELS": ("vitlab.train.sizing.levels", "LEVELS"),  # the augmentation levels
    "forward_macs": ("vitlab.train.sizing.recipe", "forward_macs"),  # a forward's MACs with token dropping
    "holds_photos": ("vitlab.train.sizing.side", "holds_photos"),  # whether the data are photos
    "level_fields": ("vitlab.train.sizing.levels", "level_fields"),  # a level's augmentation fields
    # cifar10_sweep.py: the recipe's weight-decay groups (a public `vitlab.train.param_groups`)
    "param_groups": ("vitlab.train.engine.optim", "param_groups"),
    # posemb_ablation.py: `--time-budget`'s duration syntax (a public `vitlab.train.parse_duration`)
    "parse_duration": ("vitlab.train.conf.kinds", "parse_duration"),
    # memory_calibration.py: the modules whose functions it wraps to read the memory estimate and the peaks (a
    # public hook of `vitlab.train.fit`, called with the estimate and at each epoch's end, would serve it)
    "sizing_memory": ("vitlab.train.sizing.memory", None),  # its available_memory
    "sizing_sizer": ("vitlab.train.sizing.sizer", None),  # its memory_split
    "engine_trainer": ("vitlab.train.engine.trainer", None),  # its Trainer._end_epoch
    # bench_checkpoint_save.py: the run's writer of last.pt and the budget's first estimate of an epoch end's saving
    # (a public `vitlab.train` function that saves a run's state would serve the first)
    "atomic_torch_save": ("vitlab.train.persist.state", "atomic_torch_save"),
    "save_seconds": ("vitlab.train.sizing.pace", "save_seconds"),
    # replan_replay.py: the time budget's re-planner, fed recorded or generated paces with a clock of its own (a
    # public `vitlab.train` replay of a run's paces would serve it)
    "Replanner": ("vitlab.train.sizing.budget", "Replanner"),
    "sizing_budget": ("vitlab.train.sizing.budget", None),  # its clock, which a replay sets
    # attention_runs.py: a run folder's health series and its alarms replayed over them (public in `vitlab.inspect`,
    # e.g. `health_history(run_folder)` and `replay_alarms(history, context)`, they would serve it)
    "named_alarms": ("vitlab.inspect.alarms", "named_alarms"),
    "named_notes": ("vitlab.inspect.alarms", "named_notes"),
    "alarm_history": ("vitlab.train.persist.health", "alarm_history"),
    "health_records": ("vitlab.train.persist.health", "health_records"),
    "read_metrics": ("vitlab.train.persist.outputs", "read_metrics"),  # (replan_replay.py too)
    # bench_deploy.py: the model argument's one rule (issue 57 moves it into the library, e.g. `vitlab.resolve_model`)
    # and the pieces `vitlab deploy` composes (public in `vitlab.deploy` as they are, they would serve it)
    "resolve_model": ("vitlab.commands._common", "resolve_model"),
    "folder_images": ("vitlab.deploy.check_images", "folder_images"),
    "generated_images": ("vitlab.deploy.check_images", "generated_images"),
    "int8_state": ("vitlab.deploy.quantize", "int8_state"),
    "ort_dynamic": ("vitlab.deploy.quantize", "ort_dynamic"),
    "ort_static": ("vitlab.deploy.quantize", "ort_static"),
    "torch_dynamic": ("vitlab.deploy.quantize", "torch_dynamic"),
    "logits_of": ("vitlab.deploy.agreement", "logits_of"),
    "timings": ("vitlab.deploy.agreement", "timings"),  # the batch-1 and batch-32 timings `vitlab deploy` reports
    # bench_export.py, bench_deploy.py: one-file ONNX export and its session (issue 57 moves opening an export into
    # `vitlab.deploy`)
    "export_model": ("vitlab.export", "export_model"),
    "load_exported": ("vitlab.export", "load_exported"),
    "run_exported": ("vitlab.export", "run_exported"),
    # bench_data.py: the shard reader's decode (a public `vitlab.data` decoder of encoded images and its crop)
    "decode_encoded": ("vitlab.data.images.decode", "decode_encoded"),
    "TrainDecode": ("vitlab.data.shards.stream", "TrainDecode"),
    # bench_data_check.py: the data check's pass over the files and its near-copy measure (public in `vitlab.data`,
    # e.g. `vitlab.data.fingerprints(paths)` and `vitlab.data.near_pairs(...)`, they would serve it)
    "data_check_records": ("vitlab.data.check.records", None),  # FileRecord, read_files
    "data_check_perceptual": ("vitlab.data.check.perceptual", None),  # hash_pairs, correlations, the thresholds
    # bench_heif.py: the one decoder, as a folder's file is read (a public `vitlab.data.decode_image` would serve it)
    "decode_image": ("vitlab.data.images.decode", "decode_image"),
    # bench_packed_attention.py: block-diagonal attention over packed images (a public `vitlab.models` name)
    "PackedAttention": ("vitlab.models.packed", "PackedAttention"),
    # bench_packed_attention.py --train-step: images cut into patches and packed (public `vitlab.models` names too)
    "packed_images": ("vitlab.models.packed", None),  # patchify, drop_tokens, pack
    # bench_packed_attention.py --loader: the packed loader (Patchify, SizedImages, SequenceBatches)
    "packed_loader": ("vitlab.data.pipeline.navit", None),
    # bench_cpu_inference.py, bench_native.py, memory_calibration.py: the per-path switches of vitlab.accel
    # (documented as `vitlab.accel.onednn.disabled()` ...; `vitlab.accel` exports the master switch only)
    "onednn": ("vitlab.accel.onednn", None),
    "native": ("vitlab.accel.c_kernels", None),
    "fused_block": ("vitlab.accel.fused_block", None),
}
"""``name -> (module, attribute)`` (attribute None: the module itself): what the scripts import from here that vitlab
does not export yet, imported when a script first asks for it (a script pays for its own names only: ``speedrun.py``
imports no torch, and a machine without onnxruntime still runs every script that does not export)."""


def __getattr__(name: str) -> Any:
    if name in NOT_PUBLIC:
        module, attr = NOT_PUBLIC[name]
        found = importlib.import_module(module)
        return found if attr is None else getattr(found, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *NOT_PUBLIC])


# -- 1. the clock of a whole run --------------------------------------------------------------------------------------


class Stopwatch:
    """Wall-clock seconds since it was made (``time.perf_counter``): a whole run's duration, or where a budget's
    deadline stands. Nothing is synchronised: what it times ends in Python (a command returned, a loop ended)."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the stopwatch was made."""
        return time.perf_counter() - self._start

    @property
    def started(self) -> float:
        """``time.perf_counter()`` when it was made: where a run's budget starts (a :class:`vitlab.train.sizing.Here`'s
        ``t_start``)."""
        return self._start


# -- 2. what several scripts build alike ------------------------------------------------------------------------------

CIFAR_TRAIN_STEP: dict[str, Any] = dict(
    model="vit_ti16",
    mode="train",
    batch_size=128,
    num_classes=10,
    img_size=32,
    patch_size=4,
    embed_dim=192,
    depth=9,
    num_heads=3,
    mlp_dim=384,
)
"""The small CIFAR training step of the performance targets (32 px, patch 4, width 192, depth 9, 3 heads, MLP ratio 2,
batch 128) as :func:`vitlab.bench.benchmark` keywords: ``bench_targets.py``'s ``train``, ``bench_native.py``'s pairs,
``bench_data.py``'s step."""


def photo_pixels(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """A photo-like uint8 ``(H, W, 3)`` image of ``size`` (width, height): a smooth colour field upsampled
    (bicubic) from a grid of one random colour per 64 px, plus fine noise, so that it compresses and decodes
    as a photo does (noise alone would not). ``bench_data.py``'s JPEGs and ``bench_photo_pipeline.py``'s photos."""
    from PIL import Image

    w, h = size
    coarse = Image.fromarray(rng.integers(0, 256, (max(2, h // 64), max(2, w // 64), 3), dtype=np.uint8))
    arr = np.asarray(coarse.resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
    return np.clip(arr + rng.normal(0, 4, arr.shape), 0, 255).astype(np.uint8)


def make_photo_folder(src: Path, dst: Path, *, split: str) -> Path:
    """``dst/{train,val}`` as links to ``src/train`` and ``src/<split>``: vitlab evaluates on ``val``; the photos
    are not copied (the clothing set is 3,781 JPEGs). ``defaults_vs_baseline.py --photos`` and ``busy_machine.py``."""
    if split not in ("validation", "test"):
        raise SystemExit(f"--split: validation or test, not {split!r}")
    dst.mkdir(parents=True, exist_ok=True)
    for name, sub in (("train", "train"), ("val", split)):
        if not (src / sub).is_dir():
            raise SystemExit(f"--data {src}: no {sub}/ folder (--photos wants train/, validation/ and test/)")
        link, target = dst / name, (src / sub).resolve()
        if link.is_symlink() and link.resolve() == target:
            continue  # made by an earlier run with the same --work
        if link.exists() or link.is_symlink():
            raise SystemExit(f"{link}: already there and not a link to {target}; give another --work")
        link.symlink_to(target, target_is_directory=True)
    return dst


def tiny_data(root: Path, *, per_class: int = 12, size: int = 8) -> Path:
    """A generated ImageFolder (class = the dominant colour channel) with ``train/`` and ``test/``: the data of
    ``speedrun.py --smoke`` and ``speedrun_ab.py --smoke``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", 4)):
        for c in range(3):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i:02d}.png")
    return root


SPEEDRUN_SIZE = (128, 6, 4)
"""Width, depth and heads of the speedrun's ``vit`` track model."""
SPEEDRUN_SMOKE_SIZE = (16, 1, 2)
"""The same for ``--smoke``."""


@contextlib.contextmanager
def work_folder(work: Path | None) -> Iterator[Path]:
    """The folder a benchmark writes into: ``work`` (its ``--work``, kept), or a temporary one removed at the end."""
    if work is not None:
        yield work
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def source_data(args: Any, work: Path, *, smoke_train: list[str]) -> tuple[Path, list[str]]:
    """``(the data folder, the training run's flags)`` of a script with ``--data``, ``--time-budget`` and ``--smoke``:
    generated colour classes (12 a class, under ``work``) and ``smoke_train`` with ``--smoke``, else ``--data`` under
    ``--time-budget``; no ``--data``: the script's one-line error."""
    if args.smoke:
        return tiny_data(work / "src", per_class=12), ["--no-progress", *smoke_train]
    if args.data is None:
        raise SystemExit("--data DIR (or --smoke)")
    return args.data, ["--no-progress", "--time-budget", args.time_budget]


def speedrun_vit_kwargs(*, img: int, classes: int, smoke: bool = False, fc_norm: bool | None = None) -> dict:
    """The speedrun's ``vit`` model as keywords that timm's and vitlab's ``VisionTransformer`` both take (vitlab
    keeps timm's names): 4x4 patches, width 128, depth 6, 4 heads, no class token (``fc_norm`` None: timm's default
    with global average pooling, the LayerNorm after pooling). ``speedrun_timm.py`` and ``speedrun_ab.py``."""
    width, depth, heads = SPEEDRUN_SMOKE_SIZE if smoke else SPEEDRUN_SIZE
    return {
        "img_size": img,
        "patch_size": 4,
        "num_classes": classes,
        "embed_dim": width,
        "depth": depth,
        "num_heads": heads,
        "class_token": False,
        "fc_norm": fc_norm,
    }


def speedrun_timm_model(*, img: int, classes: int, smoke: bool = False, fc_norm: bool | None = None) -> Any:
    """The speedrun's ``vit`` model in timm (:func:`speedrun_vit_kwargs`), MLP ratio 2, global average pooling."""
    import timm

    kw = speedrun_vit_kwargs(img=img, classes=classes, smoke=smoke, fc_norm=fc_norm)
    return timm.models.VisionTransformer(**kw, mlp_ratio=2.0, global_pool="avg")


def class_subset(
    src: Path, dst: Path, *, per_class: int, skip: int = 0, names: str = "keep", start: int = 0
) -> list[tuple[Path, str]]:
    """Copy ``per_class`` image files of each class folder of ``src`` (``src/<class>/*``, sorted, after the first
    ``skip``) into ``dst/<class>/``; returns ``(copied file, class)``. ``names="index"``: the copies are named by a
    running number from ``start`` (``00042.jpg``), so that no name tells a class or a split apart (CIFAR-10's files
    are numbered per class: moved to another class, ``0007.jpg`` would meet its namesake). The label checks and
    calibration benchmarks build their folders with it."""
    import shutil

    if names not in ("keep", "index"):
        raise ValueError(f"names: keep or index, not {names!r}")
    out: list[tuple[Path, str]] = []
    k = start
    for cdir in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cdir.name).mkdir(parents=True, exist_ok=True)
        for f in sorted(p for p in cdir.iterdir() if p.is_file())[skip : skip + per_class]:
            target = dst / cdir.name / (f.name if names == "keep" else f"{k:05d}{f.suffix.lower()}")
            shutil.copyfile(f, target)
            out.append((target, cdir.name))
            k += 1
    return out
