"""Label issues ranked from a model (issue 59, deliverable 3): out-of-sample probabilities from cross-validated
linear probes, confident learning on them (Northcutt et al. 2021), the folder's findings (paths relative to it, given
and suggested class, score, rank) and the options ``vitlab data check --labels --model M`` takes
(``commands/_labels.py``), including the one line without a model."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab
from imagefolder import tiny_folder
from vitlab.checkpoints import save
from vitlab.commands._labels import NEEDS_MODEL, add_label_args, label_lines, run_label_check
from vitlab.errors import ConfigError
from vitlab.evaluate import label_issue_findings, out_of_sample_probabilities, rank_label_issues
from vitlab.evaluate.label_issues import confident_joint, confident_learning
from vitlab.models import VisionTransformer


def _clusters(per_class: int = 60, classes: int = 4, dim: int = 16, seed: int = 0):
    """Gaussian clusters, one a class, well apart: features whose labels a linear probe learns."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, (classes, dim))
    labels = np.repeat(np.arange(classes), per_class)
    return centres[labels] + rng.normal(0, 1, (len(labels), dim)), labels


def _flip(labels: np.ndarray, n: int, classes: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    flipped = np.sort(rng.choice(len(labels), n, replace=False))
    noisy = labels.copy()
    noisy[flipped] = (labels[flipped] + rng.integers(1, classes, n)) % classes  # another class
    return noisy, flipped


def test_flipped_labels_are_ranked_first():
    x, y = _clusters()
    noisy, flipped = _flip(y, 12, 4)
    probs = out_of_sample_probabilities(x, noisy, 4, folds=5, seed=0)
    ranking = rank_label_issues(probs, noisy)
    assert set(ranking.order[:12].tolist()) == set(flipped.tolist())  # the 12 flips are the 12 most suspect
    # confident learning flags only flips (no false alarm), most of them: the others' true class is below its
    # threshold (the mean self-confidence of that class), and they follow first among the unflagged
    assert set(ranking.issues.tolist()) <= set(flipped.tolist()) and len(ranking.issues) >= 9
    assert np.array_equal(ranking.suggested[flipped], y[flipped])  # each with its true class suggested
    conf = ranking.self_confidence[ranking.issues]
    assert np.all(np.diff(conf) >= 0)  # lowest self-confidence first
    assert sorted(ranking.order.tolist()) == list(range(len(y)))  # every image once
    again = rank_label_issues(out_of_sample_probabilities(x, noisy, 4, folds=5, seed=0), noisy)
    assert np.array_equal(again.order, ranking.order)  # deterministic


def test_the_probabilities_are_out_of_sample():
    """Features of pure noise, labels at random: a probe that saw an image's label would echo it (in sample, its
    probability is far above chance); out of sample it is chance."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 256))
    y = rng.integers(0, 2, 200)
    probs = out_of_sample_probabilities(x, y, 2, folds=5, seed=0)
    assert probs.shape == (200, 2) and np.allclose(probs.sum(1), 1)
    own = probs[np.arange(200), y].mean()
    assert own < 0.6  # chance is 0.5
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x, y)  # the same probe, in sample
    in_sample = probe.predict_proba(x)[np.arange(200), y].mean()
    assert in_sample > 0.8  # what a probe that saw the labels says


def test_confident_learning_on_hand_made_probabilities():
    # ten images of class 0 and ten of class 1, sure of their labels; image 3 is labelled 0 but its probe is sure of 1
    probs = np.array([[0.9, 0.1]] * 10 + [[0.1, 0.9]] * 10)
    labels = np.array([0] * 10 + [1] * 10)
    probs[3] = [0.05, 0.95]
    joint, thresholds = confident_joint(probs, labels)
    assert thresholds[0] == pytest.approx((9 * 0.9 + 0.05) / 10) and thresholds[1] == pytest.approx(0.9)
    assert joint.tolist() == [[9, 1], [0, 10]]  # given x confident: one image of class 0 is confidently 1
    assert np.flatnonzero(confident_learning(probs, labels)).tolist() == [3]
    # a probe that predicts the given label never flags it, however low its confidence
    assert not confident_learning(np.array([[0.5, 0.4, 0.1]] * 4), np.zeros(4, dtype=np.int64)).any()
    # a class keeps at least one image
    lone = confident_learning(np.array([[0.1, 0.9]] * 2 + [[0.1, 0.9]] * 3), np.array([0, 0, 1, 1, 1]))
    assert lone[:2].sum() <= 1


# -- a folder -------------------------------------------------------------------------------------------------------


def _tiny_model(tmp_path: Path) -> Path:
    """A tiny random ViT saved as a folder (8 px, patch 4): its frozen features keep the images' colours."""
    torch.manual_seed(0)
    save(VisionTransformer(img_size=8, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=3), tmp_path / "m")
    return tmp_path / "m"


@pytest.fixture
def noisy_folder(tmp_path) -> tuple[Path, list[str]]:
    """The colour classes (class = bright channel) with three training images moved to another class's folder."""
    root = tiny_folder(tmp_path / "photos", per_class=20, test_per_class=2)
    moved = []
    for c, i in ((0, 3), (1, 7), (2, 11)):
        src = root / "train" / f"class{c}" / f"{i:02d}.png"
        dst = root / "train" / f"class{(c + 1) % 3}" / f"moved_{c}_{i:02d}.png"
        shutil.move(src, dst)
        moved.append(str(dst.relative_to(root)))
    return root, moved


def test_a_folders_flipped_images_come_first_as_findings(noisy_folder, tmp_path):
    root, moved = noisy_folder
    model = vitlab.load(_tiny_model(tmp_path))
    findings = label_issue_findings(model, root, cache_dir=tmp_path / "c", progress=False)
    assert {f["paths"][0] for f in findings[:3]} == set(moved)
    first = findings[0]
    assert set(first) == {"kind", "paths", "given", "suggested", "score", "suggested_score", "rank"}
    assert first["kind"] == "label_issue" and first["rank"] == 1
    assert [f["rank"] for f in findings] == list(range(1, len(findings) + 1))
    for f in findings[:3]:  # moved from class c to c+1: given c+1, suggested c
        c = int(Path(f["paths"][0]).name.split("_")[1])
        assert (f["given"], f["suggested"]) == (f"class{(c + 1) % 3}", f"class{c}")
        assert f["score"] < f["suggested_score"]
        assert not Path(f["paths"][0]).is_absolute() and (root / f["paths"][0]).is_file()  # relative to DIR
    assert "label issues:" in label_lines(findings)[0] and "moved_" in label_lines(findings)[1]


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    add_label_args(p)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(["DIR", *argv])


def test_the_check_options_need_a_model_and_rank_with_it(noisy_folder, tmp_path):
    root, moved = noisy_folder
    assert run_label_check(_args(), root) == []  # no --labels: nothing of this part runs
    with pytest.raises(ConfigError) as e:
        run_label_check(_args("--labels"), root)
    assert str(e.value) == NEEDS_MODEL and "\n" not in NEEDS_MODEL and "--model" in NEEDS_MODEL
    with pytest.raises(ConfigError, match="--model: only with --labels"):
        run_label_check(_args("--model", "m"), root)
    with pytest.raises(ConfigError, match="--folds 1"):
        run_label_check(_args("--labels", "--model", "m", "--folds", "1"), root)
    model = _tiny_model(tmp_path)
    args = _args("--labels", "--model", str(model), "--cache-dir", str(tmp_path / "c"), "--no-progress")
    findings = run_label_check(args, root)
    assert {f["paths"][0] for f in findings[:3]} == set(moved)


@pytest.mark.slow
def test_the_benchmark_runs_on_generated_data(tmp_path, monkeypatch, capsys):
    """``benchmarks/bench_label_issues.py --smoke``: the folder built, flips moved, a run trained, the table printed
    (its numbers are the lead's to measure on real data)."""
    from benchscripts import load

    bench = load("bench_label_issues")
    monkeypatch.setattr("sys.argv", ["bench_label_issues.py", "--smoke", "--work", str(tmp_path / "w")])
    bench.main()
    row = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))
    assert (row["images"], row["flipped"], row["top"]) == (36, 3, 6)
    assert 0 <= row["flipped_in_top"] <= 3 and row["chance_in_top"] == 0.5
    moved = json.loads((tmp_path / "w" / "flipped.json").read_text())
    assert len(moved) == 3 and all((tmp_path / "w" / "data" / p).is_file() for p in moved)


def test_vitlab_data_check_labels_wires_the_ranking_into_its_report(noisy_folder, tmp_path, capsys):
    """``vitlab data check DIR --labels --model M``: the label issues join the report's findings (``--json``) and
    the summary; ``--labels`` without a model is one line; ``pack`` refuses the label options."""
    from vitlab.cli import main
    from vitlab.commands._labels import NEEDS_MODEL

    root, moved = noisy_folder
    model = _tiny_model(tmp_path)
    cache = ["--cache-dir", str(tmp_path / "c"), "--no-progress"]
    assert main(["data", "check", str(root), "--labels", *cache]) == 2
    assert NEEDS_MODEL in capsys.readouterr().err
    assert main(["data", "check", str(root), "--labels", "--model", str(model), "--json", *cache]) == 0
    report = json.loads(capsys.readouterr().out)
    issues = [f for f in report["findings"] if f["kind"] == "label_issue"]
    assert {f["paths"][0] for f in issues[:3]} == set(moved) and report["counts"]["label_issue"] == len(issues)
    assert main(["data", "check", str(root), "--labels", "--model", str(model), *cache]) == 0
    assert "label issues:" in capsys.readouterr().out
    assert main(["data", "pack", str(root), str(tmp_path / "s"), "--labels", "--no-progress"]) == 2
    assert "options of vitlab data check, not of pack" in capsys.readouterr().err
