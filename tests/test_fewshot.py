"""Few-shot linear evaluation (Sec. 4.1) and the linear probe; `vitlab fewshot`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitlab
from vitlab.errors import ConfigError
from vitlab.evaluate.fewshot import (
    BIAS_CONSTANT,
    L2_GRID,
    FewShotConfig,
    evaluate_fewshot,
    fewshot_accuracy,
    fit_ridge,
    linear_probe,
    sample_shots,
)
from vitlab.inspect.images import LabelledSplit


def _sklearn_ridge_weights(x: np.ndarray, y: np.ndarray, k: int, l2: float) -> np.ndarray:
    """Independent reference: scikit-learn's Ridge on the same standardised, bias-augmented design."""
    from sklearn.linear_model import Ridge

    xs = (x - x.mean(0)) / (x.std(0) + 1e-5)
    xa = np.concatenate([xs, np.full((len(x), 1), BIAS_CONSTANT)], axis=1)
    t = 2.0 * np.eye(k)[y] - 1.0
    return Ridge(alpha=l2, fit_intercept=False, solver="cholesky").fit(xa, t).coef_.T


@pytest.mark.parametrize(("n", "d"), [(40, 6), (8, 30)])  # primal (N >= D) and dual (N < D) solutions
def test_fit_ridge_matches_sklearn_ridge(n, d):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 3, size=d) + rng.normal(size=d)
    y = np.arange(n) % 4
    for l2 in (1e-3, 1.0, 1024.0):
        clf = fit_ridge(torch.from_numpy(x), torch.from_numpy(y), 4, l2_reg=l2)
        np.testing.assert_allclose(clf.weight.numpy(), _sklearn_ridge_weights(x, y, 4, l2), rtol=1e-6, atol=1e-9)


def test_fit_ridge_interpolates_targets_without_regularisation():
    # With fewer points than features and a tiny L2, least squares hits the {-1, 1} targets exactly.
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(6, 20)))
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    clf = fit_ridge(x, y, 3, l2_reg=1e-8)
    want = 2 * torch.nn.functional.one_hot(y, 3).double() - 1
    assert torch.allclose(clf.scores(x), want, atol=1e-5)
    assert clf.predict(x).tolist() == y.tolist()


def test_sample_shots_per_class_nested_and_seeded():
    labels = np.array([0] * 10 + [1] * 10 + [2] * 3)
    five = sample_shots(labels, 5, seed=0)
    assert np.bincount(labels[five]).tolist() == [5, 5, 3]  # class 2 has only 3
    one = sample_shots(labels, 1, seed=0)
    assert set(one) <= set(five)
    assert np.array_equal(five, sample_shots(labels, 5, seed=0))
    assert not np.array_equal(five, sample_shots(labels, 5, seed=1))


def _blobs(n_per_class: int, k: int, d: int, sep: float, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = np.eye(k, d) * sep
    y = np.repeat(np.arange(k), n_per_class)
    return torch.from_numpy(centres[y] + rng.normal(size=(len(y), d))), y


def test_fewshot_accuracy_separable_and_chance():
    # No pure-noise dimensions: standardisation (as in big_vision) would blow them up to unit variance.
    xtr, ytr = _blobs(30, 4, 4, sep=20.0, seed=0)
    xte, yte = _blobs(20, 4, 4, sep=20.0, seed=1)
    res = fewshot_accuracy(xtr, ytr, xte, yte, shots=(1, 5), seeds=3)
    assert set(res) == {"1", "5"}
    assert res["5"]["per_seed"] == [1.0, 1.0, 1.0]
    assert res["5"]["train_size"] == 20
    assert res["5"]["classes_short"] == 0 and res["5"]["fewest"] == 30


def test_a_shot_count_beyond_a_class_says_so():
    """50-shot of classes with 30 and 10 images trains on all 40 and is not 50-shot: the result and the command's
    line say how many classes fell short and the fewest images one has (before: "50-shot" and a train size)."""
    xtr, ytr = _blobs(30, 2, 4, sep=20.0, seed=0)
    keep = np.concatenate([np.flatnonzero(ytr == 0), np.flatnonzero(ytr == 1)[:10]])
    xte, yte = _blobs(5, 2, 4, sep=20.0, seed=1)
    res = fewshot_accuracy(xtr[keep], ytr[keep], xte, yte, shots=(5, 20, 50), seeds=2)
    assert [res[s]["classes_short"] for s in ("5", "20", "50")] == [0, 1, 2]
    assert res["50"]["fewest"] == 10 and res["50"]["train_size"] == 40
    # Features unrelated to the labels: about chance (1/4) on 2000 test points.
    rng = np.random.default_rng(2)
    noise_tr, noise_te = torch.from_numpy(rng.normal(size=(400, 16))), torch.from_numpy(rng.normal(size=(2000, 16)))
    res = fewshot_accuracy(noise_tr, rng.integers(0, 4, 400), noise_te, rng.integers(0, 4, 2000), shots=(25,), seeds=2)
    assert 0.18 < res["25"]["mean"] < 0.32


def test_automatic_l2_is_picked_on_held_out_data():
    xtr, ytr = _blobs(30, 4, 4, sep=20.0, seed=0)
    xte, yte = _blobs(20, 4, 4, sep=20.0, seed=1)
    xva, yva = _blobs(10, 4, 4, sep=20.0, seed=2)
    res = fewshot_accuracy(xtr, ytr, xte, yte, shots=(5,), seeds=2, l2_reg=None, val=(xva, yva))
    # Every strength separates these blobs: the tie goes to the strongest regulariser.
    assert res["5"]["l2_reg"] == max(L2_GRID) == 2.0**14
    assert res["5"]["val_accuracy"] == 1.0 and res["5"]["mean"] == 1.0
    with pytest.raises(ConfigError, match="held-out"):
        fewshot_accuracy(xtr, ytr, xte, yte, shots=(5,), l2_reg=None)


def test_linear_probe_separable():
    xtr, ytr = _blobs(30, 3, 8, sep=10.0, seed=0)
    xte, yte = _blobs(30, 3, 8, sep=10.0, seed=1)
    res = linear_probe(xtr, ytr, xte, yte)
    assert res["accuracy"] == 1.0 and res["train_size"] == 90


def test_config_validation():
    with pytest.raises(ConfigError, match="shots"):
        FewShotConfig(shots=(0, 5))
    with pytest.raises(ConfigError, match="seeds"):
        FewShotConfig(seeds=0)


def _tiny():
    torch.manual_seed(0)
    return vitlab.create_model("vit_ti16", img_size=32, patch_size=8, depth=2, num_classes=3).eval()


def _coloured_splits() -> tuple[LabelledSplit, LabelledSplit]:
    """Three classes of flat colour (red, green, blue) with noise: any sane representation separates them."""
    rng = np.random.default_rng(0)

    def make(n):
        y = np.arange(n) % 3
        imgs = rng.integers(0, 60, size=(n, 16, 16, 3)).astype(np.uint8)
        imgs[np.arange(n), :, :, y] += 180
        return LabelledSplit(labels=y, get=lambda idx: imgs[np.asarray(idx)], class_names=["r", "g", "b"])

    return make(60), make(30)


@pytest.mark.slow
def test_evaluate_fewshot_on_a_model_is_deterministic_and_complete():
    model = _tiny()
    cfg = FewShotConfig(shots=(1, 5), seeds=2, max_train=30, batch_size=16)
    a = evaluate_fewshot(model, _coloured_splits(), cfg, progress=False)
    b = evaluate_fewshot(model, _coloured_splits(), cfg, progress=False)
    assert a == b and a["test_split"] == "test"
    assert a["num_classes"] == 3 and a["feature_dim"] == 192 and a["test_size"] == 30
    assert a["fewshot"]["5"]["train_size"] == 15
    assert a["fewshot"]["5"]["mean"] == 1.0
    assert a["linear_probe"]["train_size"] == 30 and a["linear_probe"]["accuracy"] == 1.0
    assert a["config"]["shots"] == [1, 5]
    json.dumps(a)  # serialisable


@pytest.mark.slow
def test_cli_fewshot_on_digits(tmp_path, capsys):
    from vitlab.cli import main

    vitlab.save(_tiny(), tmp_path / "m")
    out = tmp_path / "fs.json"
    argv = ["fewshot", "--model", str(tmp_path / "m"), "--data", "digits", "--shots", "1,5", "--seeds", "2"]
    assert main([*argv, "--max-train", "200", "--max-test", "100", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "5-shot" in printed and "probe" in printed
    assert "100 test images (test)" in printed  # which split they are (a folder's: validation, test ...)
    res = json.loads(out.read_text())
    assert res["num_classes"] == 10 and res["test_size"] == 100 and res["test_split"] == "test"
    assert res["fewshot"]["1"]["train_size"] == 10 and len(res["fewshot"]["1"]["per_seed"]) == 2
    assert 0.1 < res["fewshot"]["5"]["mean"] <= 1.0  # random features of digits beat chance
    with pytest.raises(SystemExit):
        main([*argv[:-4], "--shots", "a,b"])
    assert main([*argv, "--l2-reg", "auto", "--no-probe", "--max-test", "50", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["fewshot"]["5"]["l2_reg"] in L2_GRID and "linear_probe" not in res
    assert main([*argv, "--seeds", "0", "--out", str(out)]) == 2
    assert "seeds" in capsys.readouterr().err
