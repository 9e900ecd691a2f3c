"""Label issues ranked from a model: which training images' given labels a model's out-of-sample evidence
contradicts most (confident learning, Northcutt et al. 2021, "Confident Learning: Estimating Uncertainty in Dataset
Labels"; cleanlab's ``filter.find_label_issues``, written anew here).

The evidence must be out of sample: a classifier scored on the images it was fitted to agrees with their labels,
wrong ones included. So the model only gives features (its frozen pre-logits representation: what
:func:`~vitlab.evaluate.fewshot.extract_features` gives a linear probe), and the probabilities come from
cross-validated linear probes on them: the images split into K folds (stratified, seeded), a multinomial logistic
regression fitted on K - 1 folds predicts the held-out one, so every image gets the probabilities of a probe that
never saw its label (:func:`out_of_sample_probabilities`; cheap on a CPU: no network is trained).

Then confident learning (:func:`confident_learning`): each class's threshold is the mean probability the probes
give that class on the images labelled with it (its mean self-confidence); an image is counted as confidently of
class ``j`` when its probability of ``j`` reaches ``j``'s threshold (the largest such ``j`` when several do); the
counts (given label x confident class: the confident joint), calibrated to the class sizes, say how many images of
each given class belong elsewhere; those many are flagged in each cell, those with the largest margin ``p(j) -
p(given)`` first (cleanlab's ``prune_by_noise_rate``); an image whose probe predicts its given label is never
flagged. The flagged images are ranked by their self-confidence (the probability of the given label), lowest first:
the most suspect at the top. Every other image follows in the same order (:attr:`Ranking.order`), so a reader can
look past the flagged ones.

A model trained on the same labels has seen them: its features carry some of each wrong label (the probes are out of
sample, the backbone is not). A model that never saw them ranks better: a public backbone (``--model
augreg_in21k/vit_b16``), or a run trained on other images of these classes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError

__all__ = [
    "DEFAULT_FOLDS",
    "LabelledFolder",
    "Ranking",
    "confident_joint",
    "confident_learning",
    "folder_ranking",
    "label_issue_findings",
    "out_of_sample_probabilities",
    "rank_label_issues",
]

DEFAULT_FOLDS = 5
"""K of the cross-validated probes (cleanlab's default): each probe is fitted on 80% of the images."""
PROBE_C = 1.0
"""Inverse L2 strength of the logistic probes on standardised features (scikit-learn's default; the few-shot
evaluation's ``probe_c``)."""
_EPS = 1e-6  # (cleanlab's: a self-confidence equal to its class's threshold counts as reaching it)


def out_of_sample_probabilities(
    features: torch.Tensor | np.ndarray, labels: np.ndarray, num_classes: int, *, folds: int = DEFAULT_FOLDS,
    seed: int = 0, c: float = PROBE_C, max_iter: int = 1000,
) -> np.ndarray:  # fmt: skip
    """``(N, num_classes)`` class probabilities of every image from a probe that did not see its label: stratified
    ``folds``-fold cross-validation (shuffled by ``seed``) of a multinomial logistic regression on standardised
    ``features``. ``folds`` is lowered to the largest class's size when that is smaller (at least 2). A class no
    training fold holds gets probability 0 in that fold."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = features.double().cpu().numpy() if isinstance(features, torch.Tensor) else np.asarray(features, np.float64)
    y = np.asarray(labels, dtype=np.int64)
    n = len(y)
    if n < 2:
        raise ConfigError(f"label issues: {n} image(s); cross-validated probes need at least 2")
    k = max(2, min(folds, int(np.bincount(y).max()), n))
    probs = np.zeros((n, num_classes), dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a class smaller than K: sklearn's warning; its images still get folds)
        splits = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(x, y))
    for train, held in splits:
        seen = np.unique(y[train])
        if len(seen) < 2:  # one class to learn from: it is all the probe can say
            probs[held, seen[0]] = 1.0
            continue
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (convergence: the probabilities are used as they are)
            clf.fit(x[train], y[train])
        probs[np.ix_(held, clf.classes_)] = clf.predict_proba(x[held])
    return probs


def confident_joint(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(joint, thresholds)``: the confident joint ``C[given, true]``, calibrated so that each row sums to its
    class's size and the whole to the number of images, then rounded keeping each row's total (counts of images);
    and each class's threshold, its mean self-confidence (see the module's notes)."""
    k = probs.shape[1]
    y = np.asarray(labels, dtype=np.int64)
    counts = np.bincount(y, minlength=k).astype(np.float64)
    thresholds = np.array([probs[y == j, j].mean() if counts[j] else np.inf for j in range(k)])
    above = probs >= thresholds[None, :] - _EPS
    n_above = above.sum(1)
    guess = np.where(n_above > 1, np.where(above, probs, -np.inf).argmax(1), probs.argmax(1))
    sure = n_above > 0
    joint = np.zeros((k, k), dtype=np.float64)
    np.add.at(joint, (y[sure], guess[sure]), 1.0)
    np.fill_diagonal(joint, np.maximum(joint.diagonal(), 1.0))  # every class has at least one image of its own
    joint = joint / np.maximum(joint.sum(1, keepdims=True), 1.0) * counts[:, None]
    joint = joint / max(joint.sum(), 1.0) * counts.sum()
    return _round_rows(joint), thresholds


def _round_rows(m: np.ndarray) -> np.ndarray:
    """``m`` rounded to integers with each row's total the rounded total of the row (largest remainders first)."""
    floor = np.floor(m)
    out = floor.astype(np.int64)
    for i, row in enumerate(m):
        short = int(np.rint(row.sum())) - int(floor[i].sum())
        if short > 0:
            out[i, np.argsort(-(row - floor[i]), kind="stable")[:short]] += 1
    return out


def confident_learning(probs: np.ndarray, labels: np.ndarray, *, min_per_class: int = 1) -> np.ndarray:
    """The images whose given label confident learning calls an issue (a boolean mask; cleanlab's
    ``find_label_issues(filter_by="prune_by_noise_rate")``): from the calibrated confident joint
    (:func:`confident_joint`), ``C[i, j]`` images of given class ``i`` (``j != i``) are flagged, those with the largest
    margin ``p(j) - p(i)``; at least ``min_per_class`` images of each class stay unflagged; an image whose largest
    probability is its given class is never flagged."""
    y = np.asarray(labels, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    n, k = probs.shape
    joint, _ = confident_joint(probs, y)
    flagged = np.zeros(n, dtype=bool)
    for i in range(k):
        members = np.flatnonzero(y == i)
        if len(members) <= min_per_class:
            continue
        prune = joint[i].astype(np.float64)
        prune[i] = 0
        room = len(members) - min_per_class
        if prune.sum() > room:  # leave min_per_class of the class: fewer from each cell, in proportion
            prune = _round_rows((prune / prune.sum() * room)[None, :])[0].astype(np.float64)
        for j in np.flatnonzero(prune > 0):
            margin = probs[members, j] - probs[members, i]
            flagged[members[np.argsort(-margin, kind="stable")[: int(prune[j])]]] = True
    flagged &= probs.argmax(1) != y
    return flagged


@dataclass(frozen=True)
class Ranking:
    """Confident learning's answer on ``probs`` (out-of-sample probabilities) and the given ``labels``."""

    probs: np.ndarray
    labels: np.ndarray
    flagged: np.ndarray
    """The images confident learning calls label issues (boolean, one per image)."""
    order: np.ndarray
    """Every image, most suspect first: the flagged ones by self-confidence (lowest first), then the others."""

    @property
    def self_confidence(self) -> np.ndarray:
        """The probability of each image's given label (cleanlab's label quality score): low is suspect."""
        return self.probs[np.arange(len(self.labels)), self.labels]

    @property
    def suggested(self) -> np.ndarray:
        """The class each image's probes give the largest probability."""
        return self.probs.argmax(1)

    @property
    def issues(self) -> np.ndarray:
        """The flagged images' indices, most suspect first."""
        return self.order[: int(self.flagged.sum())]


def rank_label_issues(probs: np.ndarray, labels: np.ndarray, *, min_per_class: int = 1) -> Ranking:
    """:func:`confident_learning` on ``probs`` and ``labels``, and every image ranked, most suspect first (see
    :class:`Ranking`; ties by position, so the ranking is deterministic)."""
    probs = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    flagged = confident_learning(probs, y, min_per_class=min_per_class)
    quality = probs[np.arange(len(y)), y]
    order = np.lexsort((np.arange(len(y)), quality, ~flagged))  # flagged first, then self-confidence, then position
    return Ranking(probs=probs, labels=y, flagged=flagged, order=order)


@dataclass(frozen=True)
class LabelledFolder:
    """The images a label check ranks: their paths relative to the folder, their given labels and class names."""

    root: Path
    paths: list[str]
    labels: np.ndarray
    class_names: list[str]
    skipped: list[tuple[str, str]]
    """Files that could not be decoded (``(path, reason)``): not ranked."""


def folder_ranking(
    model: nn.Module, root: str | os.PathLike[str], *, folds: int = DEFAULT_FOLDS, seed: int = 0,
    batch_size: int = 128, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True,
    max_pixels: int | None = None, log: Callable[[str], None] | None = None,
) -> tuple[LabelledFolder, Ranking]:  # fmt: skip
    """Rank the training images of the folder ``root`` (``root/train/<class>/*``, or the class tree ``root/<class>/*``
    itself when it has no ``train/``) by ``model``'s out-of-sample evidence against their labels: decoded as ``vitlab
    eval`` decodes for ``model`` (its decode cache reused), the model's frozen pre-logits features
    (:func:`~vitlab.evaluate.fewshot.extract_features`), :func:`out_of_sample_probabilities` (``folds``, ``seed``),
    :func:`rank_label_issues`. The model's own classes do not matter (a backbone of other classes ranks as well): the
    folder's class folders are the labels. ``log``: a line about what is being done (None: silent)."""
    from ..data.cache.store import decode_files
    from ..data.images.scan import scan_classes
    from ..data.sources import DataError
    from ..inspect.images import LabelledSplit
    from .accuracy import decode_crop, decode_size
    from .fewshot import extract_features

    base = Path(root)
    if not base.is_dir():
        raise DataError(f"{base}: not a folder (an ImageFolder: train/<class>/* or <class>/*)")
    tree = base / "train" if (base / "train").is_dir() else base
    problems: list[tuple[str, str]] = []
    paths, labels, names = scan_classes(tree, None, min_classes=2, problems=problems)
    dec = decode_files(
        paths, size=decode_size(model), crop=decode_crop(model), cache_dir=cache_dir, progress=progress,
        name=f"{tree.resolve().parent.name}-{tree.resolve().name}", max_pixels=max_pixels,
    )  # fmt: skip
    kept = np.asarray(dec.kept, dtype=np.int64)
    y = np.asarray(labels, dtype=np.int64)[kept]
    if len(kept) < 2 or len(np.unique(y)) < 2:
        raise DataError(f"{tree}: {len(kept)} decodable image(s) of {len(np.unique(y))} class(es); a label check needs "
                        "images of two classes or more")  # fmt: skip
    images = dec.images
    split = LabelledSplit(labels=y, get=lambda idx: np.asarray(images[np.asarray(idx, dtype=np.int64)]),
                          class_names=list(names), name=tree.name)  # fmt: skip
    if log is not None:
        log(f"label check: features of {len(y):,} images, then {folds}-fold cross-validated linear probes")
    feats = extract_features(model, split, np.arange(len(y)), batch_size=batch_size, progress=progress,
                             desc="label features")  # fmt: skip
    probs = out_of_sample_probabilities(feats, y, len(names), folds=folds, seed=seed)
    rel = [os.path.relpath(paths[int(i)], base) for i in kept]
    skipped = problems + list(dec.skipped)
    return LabelledFolder(root=base, paths=rel, labels=y, class_names=list(names), skipped=skipped), rank_label_issues(
        probs, y
    )


def label_issue_findings(model: nn.Module, root: str | os.PathLike[str], **kwargs: Any) -> list[dict[str, Any]]:
    """The label issues of the folder ``root`` by ``model`` (:func:`folder_ranking`; ``kwargs`` are its own), as
    ``vitlab data check`` findings, most suspect first: ``{"kind": "label_issue", "paths": [path relative to root],
    "given": class, "suggested": class, "score": self-confidence (the out-of-sample probability of the given class:
    lower is more suspect), "suggested_score": the probability of the suggested class, "rank": 1, 2, ...}``."""
    folder, ranking = folder_ranking(model, root, **kwargs)
    conf, sug = ranking.self_confidence, ranking.suggested
    names = folder.class_names
    return [
        {
            "kind": "label_issue",
            "paths": [folder.paths[int(i)]],
            "given": names[int(ranking.labels[i])],
            "suggested": names[int(sug[i])],
            "score": round(float(conf[i]), 6),
            "suggested_score": round(float(ranking.probs[i, sug[i]]), 6),
            "rank": r + 1,
        }
        for r, i in enumerate(ranking.issues)
    ]
