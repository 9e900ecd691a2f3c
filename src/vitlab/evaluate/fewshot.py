"""Few-shot linear evaluation (Sec. 4.1, "Metrics") and a full linear probe.

The paper: few-shot accuracies are "obtained by solving a regularized least-squares
regression problem that maps the (frozen) representation of a subset of training
images to {-1, 1}^K target vectors. This formulation allows us to recover the exact
solution in closed form." We follow big_vision's evaluator in its conventions, not
its code: features are standardised with the statistics of the few-shot training
set, a constant feature of 100 stands in for an (almost unregularised) bias, the L2
strength defaults to 2^10, and 1, 5, 10 and 25 shots per class are averaged over 3
seeds (nested: the 5-shot set of a seed contains its 1-shot set).

The representation is the pre-logits vector,
``model.forward_head(model.forward_features(x), pre_logits=True)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError

__all__ = [
    "BIAS_CONSTANT",
    "L2_GRID",
    "FewShotConfig",
    "RidgeClassifier",
    "evaluate_fewshot",
    "extract_features",
    "fewshot_accuracy",
    "fit_ridge",
    "linear_probe",
    "sample_shots",
]

BIAS_CONSTANT = 100.0
"""Value of the appended constant feature: large, so the bias it carries is barely regularised."""

L2_GRID: tuple[float, ...] = tuple(2.0**e for e in range(-6, 16, 2))
"""Candidate L2 strengths for ``l2_reg=None`` (2^-6 ... 2^14)."""


@dataclass
class FewShotConfig:
    """Options of :func:`evaluate_fewshot` (serialised into the result JSON)."""

    shots: tuple[int, ...] = (1, 5, 10, 25)
    seeds: int = 3
    l2_reg: float | None = 2.0**10
    """Ridge L2 strength (big_vision's default); ``None``: pick it per shot count from :data:`L2_GRID` by
    accuracy on ``val_per_class`` held-out training images per class (never the test split)."""
    val_per_class: int = 20
    probe: bool = True
    """Also fit a multinomial logistic regression on all (or ``max_train``) training features."""
    probe_c: float = 1.0
    """Inverse L2 strength of the probe (scikit-learn's ``C``) on standardised features."""
    max_train: int | None = None
    """Cap on the training images the probe uses (random, fixed seed); few-shot needs only its samples."""
    max_test: int | None = None
    batch_size: int = 128

    def __post_init__(self) -> None:
        self.shots = tuple(int(s) for s in self.shots)
        if not self.shots or min(self.shots) <= 0:
            raise ConfigError(f"shots: expected positive integers, got {self.shots}")
        if self.seeds <= 0:
            raise ConfigError(f"seeds: must be positive, got {self.seeds}")
        if self.l2_reg is not None and self.l2_reg < 0:
            raise ConfigError(f"l2_reg: must be >= 0, got {self.l2_reg}")
        for opt in ("max_train", "max_test"):
            v = getattr(self, opt)
            if v is not None and v <= 0:
                raise ConfigError(f"{opt}: must be positive, got {v}")
        if self.val_per_class <= 0:
            raise ConfigError(f"val_per_class: must be positive, got {self.val_per_class}")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size: must be positive, got {self.batch_size}")


@dataclass
class RidgeClassifier:
    """A least-squares classifier: standardise, append the bias feature, ``argmax(x W)``."""

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor
    """``(D + 1, K)``, the last row multiplies the constant feature."""

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return _augment(x.double(), self.mean, self.std) @ self.weight

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.scores(x).argmax(dim=1)


def _augment(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    x = (x - mean) / std
    return torch.cat([x, torch.full((x.shape[0], 1), BIAS_CONSTANT, dtype=x.dtype)], dim=1)


def fit_ridge(x: torch.Tensor, y: torch.Tensor, num_classes: int, *, l2_reg: float = 2.0**10) -> RidgeClassifier:
    """Closed-form L2-regularised least squares onto {-1, 1}^K targets.

    ``W = argmin ||X W - Y||^2 + l2 ||W||^2`` with ``X`` the standardised features
    plus the constant column; solved as ``(X^T X + l2 I)^-1 X^T Y`` when there are at
    least as many samples as features, else in the equivalent dual form
    ``X^T (X X^T + l2 I)^-1 Y`` (few-shot sets are small: N << D).
    """
    x = x.detach().double().cpu()
    y = torch.as_tensor(y).long().cpu()
    mean = x.mean(dim=0, keepdim=True)
    std = x.std(dim=0, unbiased=False, keepdim=True) + 1e-5
    xa = _augment(x, mean, std)
    targets = 2.0 * torch.nn.functional.one_hot(y, num_classes).double() - 1.0
    n, d = xa.shape
    if n >= d:
        w = torch.linalg.solve(xa.T @ xa + l2_reg * torch.eye(d, dtype=xa.dtype), xa.T @ targets)
    else:
        w = xa.T @ torch.linalg.solve(xa @ xa.T + l2_reg * torch.eye(n, dtype=xa.dtype), targets)
    return RidgeClassifier(mean=mean, std=std, weight=w)


def sample_shots(labels: np.ndarray, shots: int, *, seed: int, num_classes: int | None = None) -> np.ndarray:
    """Indices of ``shots`` examples per class (all of them for a class that has fewer).

    One random permutation per class and seed; taking its first ``shots`` entries makes
    the sets for different shot counts of one seed nested.
    """
    rng = np.random.default_rng(seed)
    k = int(num_classes if num_classes is not None else labels.max() + 1)
    return np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:shots] for c in range(k)]).astype(np.int64)


def fewshot_accuracy(
    train_x: torch.Tensor,
    train_y: np.ndarray,
    test_x: torch.Tensor,
    test_y: np.ndarray,
    *,
    shots: Sequence[int] = (1, 5, 10, 25),
    seeds: int = 3,
    l2_reg: float | None = 2.0**10,
    num_classes: int | None = None,
    val: tuple[torch.Tensor, np.ndarray] | None = None,
) -> dict[str, dict[str, Any]]:
    """Few-shot accuracy per shot count: ``{"5": {"mean", "std", "per_seed", "train_size"}}``.

    ``train_x`` holds the features of the candidate training images (``train_y`` their
    labels); each seed draws ``shots`` per class from them, fits :func:`fit_ridge`
    and scores every test image. ``l2_reg=None`` picks the strength per shot count from
    :data:`L2_GRID` by accuracy on the held-out ``val = (features, labels)``.
    """
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    k = int(num_classes if num_classes is not None else max(train_y.max(), test_y.max()) + 1)
    return _fewshot_runs(
        lambda idx: train_x[torch.as_tensor(idx)],
        train_y,
        test_x,
        test_y,
        shots=shots,
        seeds=seeds,
        l2_reg=l2_reg,
        num_classes=k,
        val=val,
    )


def _fewshot_runs(
    features_of,
    train_y: np.ndarray,
    test_x: torch.Tensor,
    test_y: np.ndarray,
    *,
    shots: Sequence[int],
    seeds: int,
    l2_reg: float | None,
    num_classes: int,
    val: tuple[torch.Tensor, np.ndarray] | None = None,
) -> dict[str, dict[str, Any]]:
    """The loop of :func:`fewshot_accuracy`; ``features_of(train indices)`` gives their features.

    With ``l2_reg=None`` each shot count gets the strength from :data:`L2_GRID` with the best
    mean accuracy over seeds on ``val`` (ties go to the stronger regulariser).
    """
    if l2_reg is None and val is None:
        raise ConfigError("l2_reg=None (automatic) needs held-out validation features")
    out: dict[str, dict[str, Any]] = {}
    counts = np.bincount(np.asarray(train_y, dtype=np.int64), minlength=num_classes)
    for s in shots:
        fits = []
        for seed in range(seeds):
            idx = sample_shots(train_y, s, seed=seed, num_classes=num_classes)
            fits.append((features_of(idx), torch.as_tensor(train_y[idx])))
        chosen, val_acc = l2_reg, None
        if l2_reg is None:
            assert val is not None
            scores = {}
            for lam in sorted(L2_GRID, reverse=True):
                scores[lam] = float(
                    np.mean(
                        [
                            (fit_ridge(x, y, num_classes, l2_reg=lam).predict(val[0]).numpy() == val[1]).mean()
                            for x, y in fits
                        ]
                    )
                )
            chosen = max(scores, key=lambda lam: (scores[lam], lam))
            val_acc = scores[chosen]
        accs = [
            float((fit_ridge(x, y, num_classes, l2_reg=chosen).predict(test_x).numpy() == test_y).mean())
            for x, y in fits
        ]
        out[str(s)] = {
            "mean": float(np.mean(accs)),
            "std": float(np.std(accs)),
            "per_seed": accs,
            "train_size": len(fits[0][1]),
            "l2_reg": chosen,
            "classes_short": int((counts < s).sum()),  # classes with fewer than s images: all of theirs are used
            "fewest": int(counts.min()),
        }
        if val_acc is not None:
            out[str(s)]["val_accuracy"] = val_acc
    return out


def linear_probe(
    train_x: torch.Tensor,
    train_y: np.ndarray,
    test_x: torch.Tensor,
    test_y: np.ndarray,
    *,
    c: float = 1.0,
    max_iter: int = 1000,
) -> dict[str, Any]:
    """Multinomial logistic regression (L-BFGS, scikit-learn) on standardised frozen features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
    xtr, xte = train_x.double().numpy(), test_x.double().numpy()
    clf.fit(xtr, np.asarray(train_y))
    return {
        "accuracy": float((clf.predict(xte) == np.asarray(test_y)).mean()),
        "train_accuracy": float((clf.predict(xtr) == np.asarray(train_y)).mean()),
        "train_size": len(train_y),
        "C": c,
    }


@torch.no_grad()
def extract_features(
    model: nn.Module,
    images: Any,
    indices: np.ndarray,
    *,
    batch_size: int = 128,
    progress: bool = True,
    desc: str = "features",
) -> torch.Tensor:
    """Pre-logits features ``(len(indices), D)`` of ``images.get(indices)`` (a
    :class:`vitlab.inspect.images.LabelledSplit`), from the inputs ``vitlab eval`` would feed the
    model (:func:`~vitlab.evaluate.accuracy.model_inputs`), so the features match the accuracy numbers."""
    from .._progress import ProgressLog
    from ..devices import model_device
    from .accuracy import model_inputs

    cfg = model.config
    device = model_device(model)
    model.eval()
    feats = []
    starts = range(0, len(indices), batch_size)
    for i in ProgressLog(total=len(starts), desc=desc, unit="batch", enabled=progress).wrap(starts):
        x = model_inputs(model, images.get(indices[i : i + batch_size]))
        f = model.forward_head(model.forward_features(x.to(device)), pre_logits=True)
        feats.append(f.float().cpu())
    if not feats:
        return torch.zeros(0, getattr(cfg, "pre_logits_dim", 0))
    return torch.cat(feats)


def _subset(n: int, cap: int | None, seed: int) -> np.ndarray:
    if cap is None or cap >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:cap])


@dataclass
class _Split:
    fewshot: np.ndarray
    probe: np.ndarray
    val: np.ndarray
    union: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.union = np.union1d(np.union1d(self.fewshot, self.probe), self.val).astype(np.int64)


def _held_out(labels: np.ndarray, exclude: np.ndarray, per_class: int, num_classes: int, seed: int = 999) -> np.ndarray:
    """Up to ``per_class`` training indices per class that no few-shot draw uses."""
    free = np.ones(len(labels), dtype=bool)
    free[exclude] = False
    rng = np.random.default_rng(seed)
    return np.sort(
        np.concatenate([rng.permutation(np.flatnonzero(free & (labels == c)))[:per_class] for c in range(num_classes)])
    ).astype(np.int64)


def evaluate_fewshot(
    model: nn.Module,
    data: str | tuple[Any, Any],
    config: FewShotConfig | None = None,
    *,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Few-shot ridge accuracies and the linear probe of ``model`` on ``data``.

    ``data`` is a ``--data`` value (``digits``, ``cifar10``, an ImageFolder path) or a
    ``(train, test)`` pair of :class:`~vitlab.inspect.images.LabelledSplit`. Only the
    training images some seed samples (plus the probe's) go through the model. ``cache_dir``: where a folder's
    decode cache is (default ``$VITLAB_CACHE`` or ``~/.cache/vitlab``).
    """
    from ..inspect.images import labelled_splits
    from .accuracy import decode_crop, decode_size

    cfg = config or FewShotConfig()
    if isinstance(data, str):  # decoded as `vitlab eval` decodes it: the same pixels for the same files
        train, test = labelled_splits(
            data, size=decode_size(model), crop=decode_crop(model), progress=progress, cache_dir=cache_dir
        )
    else:
        train, test = data
    k = int(max(train.labels.max(), test.labels.max()) + 1)
    if len(train.class_names) > k:
        k = len(train.class_names)
    shot_idx = np.unique(
        np.concatenate([sample_shots(train.labels, max(cfg.shots), seed=s, num_classes=k) for s in range(cfg.seeds)])
    )
    probe_idx = _subset(len(train), cfg.max_train, seed=1234) if cfg.probe else np.zeros(0, dtype=np.int64)
    val_idx = (
        _held_out(train.labels, shot_idx, cfg.val_per_class, k) if cfg.l2_reg is None else np.zeros(0, dtype=np.int64)
    )
    if cfg.l2_reg is None and len(val_idx) == 0:
        raise ConfigError("automatic l2_reg needs training images beyond the few-shot samples; pass a fixed --l2-reg")
    split = _Split(shot_idx, probe_idx, val_idx)
    test_idx = _subset(len(test), cfg.max_test, seed=4321)

    feats_tr = extract_features(
        model, train, split.union, batch_size=cfg.batch_size, progress=progress, desc="train features"
    )
    feats_te = extract_features(
        model, test, test_idx, batch_size=cfg.batch_size, progress=progress, desc="test features"
    )
    # Few-shot sampling runs on the full label array; map the sampled rows onto the extracted subset.
    row = np.full(len(train), -1, dtype=np.int64)
    row[split.union] = np.arange(len(split.union))
    labels_te = test.labels[test_idx]

    fs = _fewshot_runs(
        lambda idx: feats_tr[torch.as_tensor(row[idx])],
        train.labels,
        feats_te,
        labels_te,
        shots=cfg.shots,
        seeds=cfg.seeds,
        l2_reg=cfg.l2_reg,
        num_classes=k,
        val=(feats_tr[torch.as_tensor(row[val_idx])], train.labels[val_idx]) if len(val_idx) else None,
    )

    result: dict[str, Any] = {
        "model": getattr(model.config, "name", type(model).__name__),
        "data": data if isinstance(data, str) else "custom",
        "num_classes": k,
        "feature_dim": int(feats_tr.shape[1]),
        "test_size": len(test_idx),
        "test_split": test.name,  # the evaluation split's folder (validation, test ...) or a built-in set's
        "fewshot": fs,
        "config": {**asdict(cfg), "shots": list(cfg.shots)},
    }
    if cfg.probe:
        result["linear_probe"] = linear_probe(
            feats_tr[torch.as_tensor(row[split.probe])], train.labels[split.probe], feats_te, labels_te, c=cfg.probe_c
        )
    return result
