"""``--norm-stats``: a model trained from scratch is normalised by its training set's per-channel statistics by
default (:func:`vitlab.data.channel_stats`), the saved model carries them to evaluation, an ``--init`` model keeps
its own, and a resumed run cannot change them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import copy_run
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.data import channel_stats, load_data
from vitlab.data.images.decode import match_channels
from vitlab.data.images.rows import ImageRows

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4", "--workers", "0", "--no-progress"]


def _numpy_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = images.astype(np.float64) / 255.0
    return x.mean(axis=(0, 1, 2)), x.std(axis=(0, 1, 2))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 600), side=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_channel_stats_match_numpy_over_every_image(n, side, seed):
    images = np.random.default_rng(seed).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    mean, std = channel_stats(images, in_chans=3, rows=n)
    want_mean, want_std = _numpy_stats(images)
    np.testing.assert_allclose(mean, want_mean, atol=6e-5)
    np.testing.assert_allclose(std, np.maximum(want_std, 1e-3), atol=6e-5)  # floored: a constant channel


def test_channel_stats_sample_evenly_and_read_views_in_chunks():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (3000, 4, 4, 3), dtype=np.uint8)
    base[1::2] //= 4  # odd rows darker: a sample of every other row would be biased
    view = ImageRows(base, np.arange(0, 3000, 3))  # 1,000 rows, as a split of a cache is given
    mean, std = channel_stats(view, in_chans=3, rows=1000)
    want_mean, want_std = _numpy_stats(base[::3])
    np.testing.assert_allclose(mean, want_mean, atol=6e-5)
    np.testing.assert_allclose(std, want_std, atol=6e-5)
    sampled, _ = channel_stats(view, in_chans=3, rows=100)  # 100 of the 1,000, evenly spaced
    np.testing.assert_allclose(sampled, want_mean, rtol=0.05)


def test_channel_stats_see_the_channels_the_model_sees():
    rgb = np.random.default_rng(1).integers(0, 256, (50, 5, 5, 3), dtype=np.uint8)
    grey = match_channels(torch.from_numpy(rgb).permute(0, 3, 1, 2), 1).permute(0, 2, 3, 1).numpy()
    mean, std = channel_stats(rgb, in_chans=1)
    want_mean, want_std = _numpy_stats(grey)
    assert len(mean) == len(std) == 1
    np.testing.assert_allclose(mean, want_mean, atol=6e-5)
    np.testing.assert_allclose(std, want_std, atol=6e-5)
    flat = np.full((4, 3, 3, 3), 77, dtype=np.uint8)
    assert min(channel_stats(flat, in_chans=3)[1]) > 0  # a constant channel does not divide by zero


def _train(data, out, *extra):
    return main(
        [
            "train",
            *("--data", str(data), "--out", str(out), "--cache-dir", str(out.parent / "cache")),
            *("--recipe", "digits", "--epochs", "1", "--batch-size", "16", *TINY, *extra),
        ]
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("norm") / "data")


def test_a_model_from_scratch_is_normalised_by_its_training_set(
    finished_run, finished_run_data, finished_run_stdout, tmp_path
):
    folder = finished_run_data
    out = copy_run(finished_run, tmp_path)  # the suite's tiny run, from scratch on that folder (eval writes into it)
    cfg = json.loads((out / "model" / "config.json").read_text())
    splits = load_data(str(folder), cache_dir=str(tmp_path / "cache"))
    mean, std = channel_stats(splits.train.images, in_chans=3)
    assert tuple(cfg["mean"]) == mean and tuple(cfg["std"]) == std
    assert max(abs(v - 0.5) for v in mean + std) > 0.1  # the data's (about 0.35 / 0.29 here), not 0.5 / 0.5
    text = finished_run_stdout
    assert "inputs normalised by mean " + "/".join(f"{v:.3g}" for v in mean) in text

    # evaluation of the saved model normalises as training did: the same top-1 as the run's last evaluation
    assert main(["eval", "--model", str(out / "model"), "--data", str(folder), "--cache-dir", str(tmp_path)]) == 0
    ev = json.loads((out / "model" / "eval.json").read_text())
    assert ev["top1"] == pytest.approx(json.loads((out / "summary.json").read_text())["top1"], abs=1e-9)


@pytest.mark.slow
def test_named_statistics_and_their_errors(folder, tmp_path, capsys):
    out = tmp_path / "inception"
    assert _train(folder, out, "--norm-stats", "inception") == 0
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["mean"] == [0.5, 0.5, 0.5] and cfg["std"] == [0.5, 0.5, 0.5]
    capsys.readouterr()

    # a resumed run cannot change them; naming the default is no change
    assert main(["train", "--out", str(out), "--resume", "--norm-stats", "data", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--norm-stats inception -> data" in err and "Traceback" not in err

    # fine-tuning keeps the --init model's normalisation: asking for another is a one-line error
    args = ["finetune", "--init", str(out / "model"), "--data", str(folder), "--out", str(tmp_path / "ft")]
    assert main([*args, "--norm-stats", "data", "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--norm-stats data" in err and "--init" in err
