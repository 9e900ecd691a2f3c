"""The third fault sweep's training faults (issue 56): model sizes checked by arithmetic before any module is built,
``--threads`` capped at the cores there are, skipped NaN steps counted instead of averaged in as 0, a planned stop
that exits 0, and one line (never a traceback, never a hang) for absurd option values, data values that cannot be
paths and a ``last.pt`` whose contents are not what vitlab writes."""

from __future__ import annotations

import json
import math
import os
import shutil
import types
from pathlib import Path

import pytest
import torch

import vitlab
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models.config import ViTConfig
from vitlab.models.vit import VisionTransformer
from vitlab.train.objectives import classify as classify_mod
from vitlab.train.sizing import memory

GiB = 1 << 30


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("train-faults") / "rgb")


def train_args(data: Path, out: Path, *extra: str, epochs: int = 2) -> list[str]:
    """A tiny run: 3 steps an epoch of 16 images, one thread, no workers."""
    return ["train", "--data", str(data), "--out", str(out), "--cache-dir", str(out.parent / "cache"),
            "--recipe", "small-data", "--epochs", str(epochs), "--batch-size", "16", "--warmup-epochs", "1",
            "--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--workers", "0", "--threads", "1",
            "--no-progress", *extra]  # fmt: skip


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vitlab train: error: ") and "Traceback" not in err, err
    return err.strip()


@pytest.fixture
def no_module_built(monkeypatch):
    """Fail the test if any ViT is constructed (the size check must come first)."""

    def refuse(self, *a, **k):
        raise AssertionError("a model was built before the size check")

    monkeypatch.setattr(VisionTransformer, "__init__", refuse)


# -- model sizes by arithmetic -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--depth", "100000"], "--depth 100000"),
        (["--dim", "100000000", "--heads", "1"], "--dim 100000000"),
        (["--depth", "100000", "--dim", "384"], "--depth 100000, --dim 384"),
        (["--reg-tokens", "100000000"], "--reg-tokens 100000000"),
        (["--img-size", "60000", "--patch-size", "2"], "--patch-size 2, --img-size 60000"),
    ],
)
def test_a_model_too_big_for_memory_is_refused_before_the_data_and_any_module(
    flags, named, tmp_path, monkeypatch, capsys, no_module_built
):
    """Before: ``--depth 100000`` built the model block by block (on the meta device, to count its parameters) after
    decoding the data, until the machine killed it at 2.6-3.5 GB."""
    monkeypatch.setattr(memory, "available_memory", lambda device: (4 * GiB, "test"))
    missing = tmp_path / "no-such-data"  # the data would fail next: the size is checked first
    assert main(["train", "--data", str(missing), "--out", str(tmp_path / "run"), *flags]) == 2
    err = one_line(capsys)
    assert err.startswith(f"vitlab train: error: {named}: the model (") and "parameters at its smallest) needs ~" in err
    assert "more than the 4.0 GiB available (test); lower " in err and "no-such-data" not in err
    assert not (tmp_path / "run").exists()


def test_a_config_files_sizes_are_checked_and_its_non_integers_refused(tmp_path, monkeypatch, capsys, no_module_built):
    monkeypatch.setattr(memory, "available_memory", lambda device: (4 * GiB, "test"))
    missing = str(tmp_path / "no-such-data")
    cases = {
        "width.yaml": ("arch:\n  embed_dim: 120000000\n", "width.yaml: arch.embed_dim 120000000: the model ("),
        "recipe.yaml": (
            "recipe:\n  name: small-data\n  arch: {embed_dim: 100000000, depth: 2, num_heads: 2, patch_size: 4, "
            "mlp_dim: 8}\n",
            "recipe.yaml: recipe.arch: the model (",
        ),
        "float.json": ('{"arch": {"embed_dim": 1e8}}', "float.json: arch.embed_dim: expected an integer, got 1"),
        "text.yaml": ("arch:\n  embed_dim: 1e8\n", "text.yaml: arch.embed_dim: expected an integer, got '1e8'"),
        "nested.yaml": (
            "recipe:\n  name: small-data\n  arch: {embed_dim: 1.0e+8}\n",
            "nested.yaml: recipe.arch: embed_dim: expected an integer, got float 100000000.0",  # as a config.json's
        ),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["train", "--config", str(tmp_path / name), "--data", missing, "--out", str(tmp_path / "r")]) == 2
        err = one_line(capsys)
        assert expected in err.replace(str(tmp_path) + "/", ""), err


def test_create_model_checks_the_size_before_any_block(monkeypatch):
    from vitlab.models import room

    monkeypatch.setattr(room, "memory_room", lambda: 4 * GiB)
    built = []
    make_block = VisionTransformer._make_block
    monkeypatch.setattr(VisionTransformer, "_make_block", lambda *a, **k: built.append(1) or make_block(*a, **k))
    for kw in ({"depth": 100000}, {"embed_dim": 100_000_000, "num_heads": 1}, {"mlp_ratio": 1e5}):
        with pytest.raises(ConfigError) as e:
            vitlab.create_model("vit_ti16", **kw)
        assert "needs ~" in str(e.value) and "this process can still allocate" in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
    with torch.device("meta"), pytest.raises(ConfigError, match="blocks of width 8"):  # its objects alone
        VisionTransformer(ViTConfig(depth=1_000_000, embed_dim=8, num_heads=2, mlp_dim=16))
    assert built == []
    assert vitlab.create_model("vit_ti16", num_classes=3).num_params() > 0  # a model that fits is built


def test_the_runs_parameter_counts_are_arithmetic(monkeypatch):
    """Counting the parameters of a run's model no longer builds it (before: every block, on the meta device)."""
    from vitlab.train.objectives.classify import Classify
    from vitlab.train.objectives.mpp import MPP

    mc = ViTConfig(img_size=32, patch_size=4, embed_dim=32, depth=2000, num_heads=2, mlp_dim=64, num_classes=10)
    blocks = []
    make_block = VisionTransformer._make_block
    monkeypatch.setattr(VisionTransformer, "_make_block", lambda *a, **k: blocks.append(1) or make_block(*a, **k))
    for learns in ("classify", "mpp"):
        params, block, root = memory.parameter_counts(mc, learns=learns)
        assert block == mc.block_params() and params == root + 2000 * block
    assert len(blocks) <= 2  # a one-block ViT, to count what an objective's wrapper adds
    small = mc.replace(depth=3)
    with torch.device("meta"):
        for learns, objective in (("classify", Classify), ("mpp", MPP)):
            net = objective.wrap(VisionTransformer(small))
            assert memory.parameter_counts(small, learns=learns)[0] == sum(p.numel() for p in net.parameters())


# -- threads -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_threads_are_capped_at_the_cores_this_process_may_use(data_dir, tmp_path, monkeypatch, capsys):
    """Before: ``--threads 1000`` went to OpenMP as is (on two cores libgomp ended the process, no vitlab line)."""
    from vitlab.bench.workers import num_threads
    from vitlab.devices import cap_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    asked: list[int] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (asked.append(n), real(min(n, 2)))[1])
    before = torch.get_num_threads()
    try:
        assert main([*train_args(data_dir, tmp_path / "run", epochs=1), "--threads", "1000", "--stop-after", "1"]) == 0
        with num_threads(10**30) as n:  # vitlab bench's rule
            assert n <= 2
    finally:
        real(before)
    assert asked and max(asked) <= 2, asked
    assert "cpu: 2 torch thread(s) (--threads 1,000: capped at the 2 core(s) this process may run on)" in (
        capsys.readouterr().out
    )
    assert cap_threads(2) == (2, None) and cap_threads(3)[0] == 2


# -- skipped NaN steps are counted -------------------------------------------------------------------------------


def _nan_at(monkeypatch, calls: set[int]) -> None:
    """The training loss NaN on the given (1-based) training micro-batches (evaluation's calls, without gradients,
    are not counted)."""
    real = torch.nn.functional
    n = {"calls": 0}

    def cross_entropy(*a, **k):
        loss = real.cross_entropy(*a, **k)
        if not torch.is_grad_enabled():
            return loss
        n["calls"] += 1
        return loss * float("nan") if n["calls"] in calls else loss

    monkeypatch.setattr(classify_mod, "F", types.SimpleNamespace(cross_entropy=cross_entropy))


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_skipped_nan_steps_are_counted_not_averaged_in_as_zero(data_dir, tmp_path, monkeypatch, capsys, step_losses):
    """Before: a skipped step's micro-batches counted in the mean with nothing added: an epoch of skipped steps logged
    ``train_loss 0.0``, one skip out of three pulled the mean down by a third."""
    out = tmp_path / "run"
    _nan_at(monkeypatch, {1, 2, 3, 5})  # epoch 1: every step; epoch 2: its second step
    assert main([*train_args(data_dir, out, "--on-nan", "skip", "--log", "csv"), "--epochs", "2"]) == 0
    rows = _rows(out)
    assert rows[0]["train_loss"] is None and rows[0]["nan_skipped"] == 3
    assert math.isnan(step_losses[0]) and math.isnan(step_losses[2])  # the progress line's loss: skipped, not 0
    taken = [step_losses[3], step_losses[5]]
    assert rows[1]["nan_skipped"] == 1 and rows[1]["train_loss"] == pytest.approx(sum(taken) / 2, rel=1e-6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nan_skipped"] == 4 and summary["steps"] == 6
    text = capsys.readouterr().out
    assert "epoch 1/2 step 3: train loss none (3 step(s) skipped: NaN/Inf loss)" in text
    assert "epoch 2/2 step 6: train loss " in text and "(1 step(s) skipped: NaN/Inf loss)" in text
    header = (out / "scalars.csv").read_text().splitlines()[0].split(",")
    assert "nan_skipped" in header  # the tracker gets the count; a missing mean is no 0


@pytest.mark.slow
def test_a_resumed_epoch_counts_the_steps_skipped_before_the_stop(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _nan_at(monkeypatch, {1})
    assert main(train_args(data_dir, out, "--on-nan", "skip", "--stop-after", "2", epochs=1)) == 0
    monkeypatch.undo()
    assert main(["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0"]) == 0
    (row,) = _rows(out)
    assert row["nan_skipped"] == 1 and math.isfinite(row["train_loss"])
    assert json.loads((out / "summary.json").read_text())["nan_skipped"] == 1


def test_every_rank_skips_the_step_one_rank_found_non_finite(monkeypatch):
    """DDP all-reduces the gradients: a NaN on one rank is in every rank's; each rank must skip that step."""
    from vitlab.distributed import Dist
    from vitlab.train.conf.recipes import get_recipe
    from vitlab.train.engine import loop
    from vitlab.train.engine.optim import build_optimization
    from vitlab.train.objectives.classify import Classify

    torch.manual_seed(0)
    net = VisionTransformer(ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16,
                                      num_classes=3))  # fmt: skip
    recipe = get_recipe("small-data", batch_size=4, clip_grad=None)
    opt = build_optimization(net, recipe=recipe, lr=1e-2, device=torch.device("cpu"), use_scaler=False,
                             lr_factor=lambda step: 1.0)  # fmt: skip
    votes = iter([False, True, False])  # the other rank's loss was NaN at the second step

    def any_rank(flags, d):
        return [flags[0] or next(votes)]

    monkeypatch.setattr(loop, "any_rank", any_rank)
    parts = loop.StepParts(net=net, objective=Classify(num_classes=3), opt=opt, recipe=recipe,
                           device=torch.device("cpu"), on_nan="skip", dist=Dist(rank=0, world_size=2))  # fmt: skip
    weights = []
    batches = [(torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])) for _ in range(3)]
    res = loop.train_epoch(parts, batches, on_step=lambda r, loss: weights.append(net.head.weight.clone()) and False)
    assert res.skipped == 1 and res.counted == 2
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])


# -- a planned stop exits 0 ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_config_files_stop_after_exits_0_as_the_flag_does(data_dir, tmp_path):
    """Before: ``stop_after: 1`` in a config file exited 130, as if Ctrl-C had stopped the run."""
    config = tmp_path / "c.yaml"
    config.write_text("stop_after: 1\n")
    assert main([*train_args(data_dir, tmp_path / "a"), "--config", str(config)]) == 0
    assert main([*train_args(data_dir, tmp_path / "b"), "--stop-after", "1"]) == 0
    for run in ("a", "b"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["interrupted"] and "signal" not in summary and summary["steps"] == 1


# -- one line for absurd values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a" * 1_000_000, "--data: 1,000,000 characters, longer than any path (4,096)"),
        ("{" * 50_000, "--data: 50,000 characters, longer than any path (4,096)"),
        ("x" * 300, "--data: holds a name of 300 bytes, longer than a file system allows (255)"),
        ("photos/" + "{" * 3000 + "x.tar", "--data: holds a name of 3,005 bytes, longer than a file system allows"),
        ("", "--data: empty; give a folder, file or URL"),
    ],
)
def test_a_data_value_that_cannot_be_a_path_is_one_line(value, expected, tmp_path, capsys):
    """Before: ``File name too long`` from the data fingerprint, a traceback (for a million characters the value
    itself filled the terminal)."""
    assert main(["train", "--data", value, "--out", str(tmp_path / "run")]) == 2
    err = one_line(capsys)
    assert err == f"vitlab train: error: {expected}" or err.startswith(f"vitlab train: error: {expected}"), err
    assert len(err) < 300


def test_an_empty_out_or_cache_dir_is_refused_instead_of_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--out", "", "--stop-after", "1", "--no-progress"]) == 2
    assert one_line(capsys) == "vitlab train: error: --out: empty; give a folder, file or URL"
    assert main(["train", "--out", "run", "--cache-dir", " ", "--stop-after", "1", "--no-progress"]) == 2
    assert one_line(capsys) == "vitlab train: error: --cache-dir: empty; give a folder, file or URL"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written in the current folder


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--pack", "--pack-res", "4,inf"], "argument --pack-res: 'inf': expected a finite number"),
        (["--pack", "--pack-res", "4,1e9"], "--pack-res 4,1e+09: expected 0 < LOW <= HIGH <= 65536"),
        (["--lr", "nan"], "argument --lr: 'nan': expected a finite number"),
        (["--lr", "inf"], "argument --lr: 'inf': expected a finite number"),
        (["--val-split", "inf"], "argument --val-split: 'inf': expected a finite number"),
        (["--seed", "1" + "0" * 29], "--seed 1e+29: out of range [0, 2**63)"),
        (["--randaugment", "100,1000"], "--randaugment: 100,1000: expected 0..16 operations and a magnitude in 0..30"),
        (["--accum-steps", "10000000"], "--accum-steps: 1e+07 is more than 1,048,576"),
        (["--img-size", "70000"], "--img-size 70000: out of range"),
        (["--model", "a" * 100_000], "--model: 100,000 characters, longer than a registered name"),
        (["--device", "c" * 100_000], "--device: 100,000 characters, longer than a device name"),
    ],
)
def test_absurd_option_values_are_one_line_before_any_work(flags, expected, tmp_path, capsys):
    missing = tmp_path / "no-such-data"
    try:
        rc = main(["train", "--data", str(missing), "--out", str(tmp_path / "run"), *flags])
    except SystemExit as e:  # argparse's own line (and its usage)
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and "no-such-data" not in err, err
    assert len(err.splitlines()[-1]) < 300  # the value is never echoed whole


def test_a_non_finite_or_impossible_number_in_a_config_file_is_refused(tmp_path, capsys):
    """NaN and infinities, and recipe fields that silently train something else: a negative ``base_batch`` (a
    negative scaled LR), a momentum of 1e300, a final LR ratio above 1."""
    for text, key in (
        ("recipe:\n  lr: .nan\n", "recipe.lr"),
        ("pack: true\npack_res: [4, .inf]\n", "pack_res"),
        ("recipe:\n  base_batch: -1\n", "recipe.base_batch"),
        ("recipe:\n  momentum: 1.0e+300\n", "recipe.momentum"),
        ("recipe:\n  min_lr_ratio: 1.0e+300\n", "recipe.min_lr_ratio"),
        ("recipe:\n  betas: [0.9, 2]\n", "recipe.betas"),
    ):
        (tmp_path / "c.yaml").write_text(text)
        assert main(["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 2
        err = one_line(capsys)
        assert f"c.yaml: {key}: expected " in err or f"c.yaml: {key}: must be " in err, err


@pytest.mark.slow
def test_a_batch_of_ten_to_the_21_is_refused_at_once(tmp_path, capsys):
    """Before: accepted, then the memory fit listed the batch's divisors one by one: the run never started."""
    assert main(["train", "--batch-size", "1" + "0" * 21, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.splitlines() == ["vitlab train: error: --batch-size: 1e+21 is more than 16,777,216"]


def test_many_workers_are_named_in_the_memory_refusal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda device: (4 * GiB, "test"))
    assert main(["train", "--workers", "100000", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "; lower --workers 100,000, lower --img-size" in one_line(capsys)


# -- last.pt that vitlab did not write --------------------------------------------------------------------------------


def _edited(run: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    state = torch.load(out / "last.pt", weights_only=True)
    edit(state)
    torch.save(state, out / "last.pt")
    return out


def _set_config(key, value):
    def edit(state):
        config = json.loads(state["config"])
        config[key] = value
        state["config"] = json.dumps(config)

    return edit


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (_set_config("data", ["a"]), "config: data: expected a string, got ['a']"),
        (_set_config("data", None), "config: data: expected a string, got None"),
        (_set_config("threads", "many"), "config: threads: expected an integer, got 'many'"),
        (_set_config("recipe", None), "config: recipe: expected an object, got NoneType"),
        (lambda s: s.update(config=None), "config: expected the run's configuration as JSON text, got NoneType"),
        (lambda s: s.update(config="[1]"), "config: expected an object of options, got list"),
        (lambda s: s.update(plan=None), "plan: expected a mapping, got NoneType None"),
        (lambda s: s.update(epoch="x"), "epoch: expected an integer >= 0, got str 'x'"),
        (lambda s: s.update(step=-5), "step: expected an integer >= 0, got int -5"),
        (lambda s: s.update(best_top1=math.inf), "best_top1: expected a finite number, got float inf"),
        (lambda s: s.update(rng=[1]), "rng: expected a mapping, got list [1]"),
        (lambda s: s["rng"].update(numpy_pos="x"), "rng.numpy_pos: expected an integer in [0, 624]"),
        (lambda s: s.update(model=[1]), "model: expected a mapping, got list [1]"),
        (lambda s: s.update(data_fingerprint='{"classes": 5}'), "data fingerprint is not one vitlab wrote"),
        (lambda s: s.update(model={}), "its weights or optimizer state do not fit the run it describes (RuntimeError"),
        (lambda s: s.update(optimizer={}), "its weights or optimizer state do not fit the run it describes (KeyError"),
    ],
)
def test_a_last_pt_vitlab_did_not_write_is_one_line(edit, expected, finished_run, tmp_path, capsys):
    """Before: ``AttributeError: 'list' object has no attribute 'strip'`` and other tracebacks from inside the run."""
    out = _edited(finished_run, tmp_path, edit)  # a copy of the suite's tiny run, its last.pt edited
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0"]) == 2
    err = one_line(capsys)
    assert expected in err, err
    assert not (out / ".lock").exists()
