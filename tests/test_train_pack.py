"""``vitlab train --pack`` (NaViT: Dehghani et al. 2023): images of mixed shapes trained at their own aspect ratio,
packed into sequences; both evaluations reported; stopped mid-epoch and resumed == the run that never stopped, on
a folder and on tar shards; one-line refusals where packing cannot apply; the memory estimate follows the packed
sequence length."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from benchscripts import load as load_benchmark
from vitlab.cli import main
from vitlab.models import model_config
from vitlab.train.conf.train_config import TrainConfig
from vitlab.train.engine import trainer
from vitlab.train.persist.state import load_state
from vitlab.train.sizing.memory import estimate

# 24 training images (3:4, 4:3, 1:1 and 9:16): batch 8, 3 steps an epoch; every random path of a packed run
RUN = ["--epochs", "2", "--dim", "16", "--depth", "1", "--heads", "2", "--seed", "3", "--threads", "1"]
RUN += ["--img-size", "12", "--patch-size", "2", "--pack", "--pack-res", "8,16", "--crop-scale", "0.35,1"]
RUN += ["--randaugment", "2,9", "--hflip", "0.5", "--token-drop", "0.25", "--drop-path", "0.1", "--ema", "0.9"]
RUN += ["--no-progress"]
STOP = 4  # one step into the second epoch
KEYS = ("epoch", "step", "train_loss", "lr", "top1", "top1_native", "eval_loss_native", "padding")
SHAPES = [(16, 12), (12, 16), (16, 16), (9, 16)]


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch):
    """The runs here draw no figures (matplotlib is most of a tiny run's time; the figures have their own tests)."""
    monkeypatch.setattr(trainer, "draw_run_figures", lambda *a, **k: None)


def _folder(root):
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 2)):
        for c in range(3):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                a = rng.integers(0, 80, (*SHAPES[i % 4], 3)).astype(np.uint8)
                a[..., c] += 150
                Image.fromarray(a).save(d / f"{i:02d}.png")
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    folder = _folder(root / "mixed")
    assert main(["data", "pack", str(folder), str(root / "shards"), "--shard-size", "2000", "--no-progress"]) == 0
    return {
        "folder": ["--data", str(folder), "--cache-dir", str(root / "cache")],
        "shards": ["--data", str(root / "shards"), "--shuffle-buffer", "10"],
    }


def outcome(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    state = load_state(out / "last.pt")
    weights = {f"model.{k}": v for k, v in state["model"].items()}
    weights |= {f"ema.{k}": v for k, v in (state["ema"] or {}).items()}
    return [{k: r[k] for k in KEYS} for r in rows], weights


@pytest.mark.slow
@pytest.mark.parametrize(("loader", "workers", "resume_workers"), [("folder", 0, 1), ("shards", 1, 0)])
def test_packed_run_stopped_mid_epoch_and_resumed_is_the_uninterrupted_run(
    sources, tmp_path, capsys, loader, workers, resume_workers
):
    full = tmp_path / "full"
    assert main(["train", *sources[loader], "--out", str(full), "--workers", str(workers), *RUN]) == 0
    printed = capsys.readouterr().out
    assert "native aspect top-1" in printed and "padding" in printed
    want = outcome(full)
    assert [r["step"] for r in want[0]] == [3, 6]
    assert all(0 <= r["padding"] < 1 and 0 <= r["top1_native"] <= 1 for r in want[0])
    assert "top1_native" in json.loads((full / "summary.json").read_text())

    out = tmp_path / "run"
    assert main(["train", *sources[loader], "--out", str(out), "--workers", str(workers), *RUN,
                 "--stop-after", str(STOP)]) == 0  # fmt: skip
    state = load_state(out / "last.pt")
    assert (state["epoch"], state["step"], state["micro_in_epoch"]) == (1, STOP, 1)  # mid-epoch
    assert state["epoch_tokens"][1] > 0  # the padding so far travels with the position
    resume = ["train", "--out", str(out), "--resume", "--workers", str(resume_workers), "--no-progress"]
    assert main(resume) == 0
    rows, weights = outcome(out)
    assert rows == want[0]  # floats compared exactly, the epoch's padding too
    assert weights.keys() == want[1].keys()
    for k, v in want[1].items():
        assert torch.equal(weights[k], v), k


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--pack", "--objective", "mpp"], "--objective mpp with --pack: not supported"),
        (["--pack", "--mixup", "0.5"], "--mixup 0.5 with --pack: not supported"),
        (["--pack", "--compile"], "--compile with --pack: not supported"),
        (["--pack-len", "64"], "--pack-len applies to packed training: add --pack"),
        (["--pack", "--pack-res", "16,8"], "--pack-res 16,8: expected 0 < LOW <= HIGH"),
    ],
)
def test_what_packing_cannot_combine_with_is_one_line_before_any_work(tmp_path, capsys, extra, says):
    assert main(["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("vitlab train: error: ") and says in err, err


def test_a_model_that_needs_whole_images_is_refused_in_one_line(sources, tmp_path, capsys):
    argv = ["train", *sources["folder"], "--out", str(tmp_path / "o"), "--model", "vit_cct7_3x1", "--depth", "1"]
    assert main([*argv, "--dim", "16", "--heads", "2", "--img-size", "12", "--pack", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--pack: not supported with this model" in err and "stem" in err, err


def test_the_memory_estimate_follows_the_packed_sequence_length():
    mc = model_config("vit_ti16", img_size=64, num_classes=10)  # 16 patches + the class token an image

    def activations(**kw) -> int:
        return estimate(TrainConfig(**kw), mc, micro=32, eval_batch=32, device_type="cuda").activations

    # 17 tokens a sequence hold one image, 170 ten: 32 images take 32 or 4 sequences (40 images' room)
    assert activations(pack=True, pack_len=170) > activations(pack=True, pack_len=17) == activations()


@pytest.mark.slow
def test_the_pack_vs_square_benchmark_runs_both_arms_and_writes_its_table(sources, tmp_path):
    bench = load_benchmark("pack_vs_square")
    out = tmp_path / "table.md"
    argv = ["--data", sources["folder"][1], "--cache-dir", sources["folder"][3], "--out", str(out), "--seeds", "0"]
    argv += ["--runs", str(tmp_path / "runs"), "--epochs", "1", "--img-size", "12", "--patch-size", "2"]
    argv += ["--pack-res", "8,16", "--eval-res", "8,16", "--dim", "16", "--depth", "1", "--heads", "2"]
    assert bench.main([*argv, "--threads", "1", "--workers", "0", "--no-progress"]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["arm"] for r in rows] == ["square", "pack"]
    assert rows[0]["padding"] is None and 0 <= rows[1]["padding"] < 1
    assert all(set(r["native_at"]) == {"8", "16"} for r in rows)
    assert "| pack | 0 |" in out.read_text()


def test_the_tokens_a_second_of_an_epoch_cut_short_count_the_images_it_made():
    """A time budget's last epoch ends part-way: its mean tokens an image is taken over the micro-batches it made,
    not over the whole epoch's (which read about half on 10-minute runs whose last epoch made 11 of 23 steps)."""
    from types import SimpleNamespace

    from vitlab.distributed import Dist
    from vitlab.train.engine.navit import packed_metrics

    objective = SimpleNamespace(evaluate=lambda *a, **k: {"top1": 0.5, "top5": 0.9, "loss": 1.0})
    loaders = SimpleNamespace(packed=True, micro=8, micro_per_epoch=12, native_eval_batches=lambda: [])

    def tokens_per_sec(micro_done: int) -> float:
        # 20 tokens an image in every micro-batch made, 25 slots an image
        position = SimpleNamespace(micro=micro_done, tokens=20 * 8 * micro_done, slots=25 * 8 * micro_done)
        row = packed_metrics(objective, None, loaders=loaders, position=position, dist=Dist(), device="cpu",
                             amp_dtype=None, images_per_sec=100.0)  # fmt: skip
        assert row["padding"] == pytest.approx(0.2)
        return row["tokens_per_sec"]

    assert tokens_per_sec(12) == pytest.approx(2000.0)  # the whole epoch
    assert tokens_per_sec(3) == pytest.approx(2000.0)  # a quarter of it: the same tokens an image
