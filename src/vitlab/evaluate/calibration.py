"""Calibrated probabilities: temperature scaling and the expected calibration error (Guo et al. 2017, "On
Calibration of Modern Neural Networks").

A classifier's softmax says how sure it is; a ViT trained on a small folder (with label smoothing, or for long)
says it wrongly: of the images it calls 90% sure, 60% may be right. Temperature scaling divides the logits by one
number ``T > 0`` fitted on held-out images (the NLL of their labels minimised), which leaves every prediction (the
argmax) as it was and makes the probabilities mean what they say. The ECE measures how far they are from that:
the images binned by their top-1 confidence into 15 equal-width bins, ``sum over bins of |accuracy - confidence|``
weighted by the bin's share of the images.

Which images fit ``T`` (:func:`calibrate`): the run's evaluation split, **every other image of it**: the images at
even positions of the evaluation order fit ``T``, those at odd positions measure the ECE reported beside it (with
``T``: ``ece``; without: ``ece_uncalibrated``). So the reported ECE is that of exactly the probabilities ``vitlab
predict`` gives (``softmax(logits / T)`` with the stored ``T``), on images that did not choose ``T``; cross-fitting
(a ``T`` per half, each scored on the other) would report the ECE of two temperatures no model holds. Interleaved,
not halved: the evaluation order is the class folders' order, so its first half would hold other classes than its
second. No extra forward pass: the logits are the final evaluation's (:class:`LogitKeeper`).

A fitted ``T`` is kept only when it pays on images that did not fit it: within the fitting half, a temperature fitted
on each half of it must lower the NLL of the other half (2-fold, summed) against ``T = 1``; else the model keeps
``T = 1`` and says so. Nor is it kept when every fitting image is right (the model's top class): their NLL then
falls without end as ``T`` shrinks, the fit stops at :data:`T_MIN`, and that bound, not the images, would set how
sure ``vitlab predict`` is (50 times the logits: 97.5% on a picture of a class the model never saw, a 3-class run
of 8 held-out images). A run with label smoothing and token dropping is often calibrated already, and a ``T`` fitted
on 170 images then moved the probabilities of images it had not seen away from the truth (the clothing photos:
``ece`` 0.109 with the fitted ``T = 0.85`` against 0.084 without, docs/data_check.md). The check reads only the
fitting half: the reporting half still chooses nothing.

A model stores ``T`` in its ``config.json`` (``extra["temperature"]``); a value that is not a finite positive number
is ignored when the model is read (with a warning): :func:`checked_temperature`. A model without one (older models,
timm, Hugging Face and public checkpoints) has ``T = 1``. An export bakes ``T`` into its graph
(:func:`bake_temperature`) and records it; vitlab's runtime gives back the model's own logits.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "ECE_BINS",
    "HELD_OUT",
    "MAX_KEPT_LOGITS",
    "TEMPERATURE_KEY",
    "T_MAX",
    "T_MIN",
    "Calibration",
    "LogitKeeper",
    "Reliability",
    "bake_temperature",
    "calibrate",
    "checked_temperature",
    "expected_calibration_error",
    "fit_temperature",
    "model_temperature",
    "probabilities",
    "temperature_pays",
]

ECE_BINS = 15
"""Equal-width bins of top-1 confidence over (0, 1] (Guo et al.'s 15)."""
TEMPERATURE_KEY = "temperature"
"""The key of a model's ``config.json`` ``extra`` that holds its temperature."""
T_MIN, T_MAX = 0.02, 50.0
"""The range a fitted temperature is searched in (a model 50x too sure, or 50x too unsure, is at its edge)."""
MAX_KEPT_LOGITS = 1 << 25
"""Most logit values (float32: 128 MiB) an evaluation keeps for the temperature fit: ImageNet's 50,000 x 1,000 keeps
every other image (:class:`LogitKeeper`); a folder of 10,000 images of 100 classes keeps them all."""
HELD_OUT = (
    "every other image of the evaluation split, in its order: the even positions fit the temperature, the odd ones "
    "measure the ECE"
)
"""Which images fit the temperature and which measure the ECE reported (:func:`calibrate`), as records say it."""
_BISECTIONS = 60
_CHUNK = 1 << 20  # logit values per chunk of the fit (float64: 8 MiB)


def checked_temperature(value: Any) -> float | None:
    """``value`` as a temperature: a finite positive number (not a bool), as a float; None for anything else. A
    temperature is data read from a file (``config.json``), never trusted as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    t = float(value)
    return t if math.isfinite(t) and t > 0 else None


def model_temperature(model: Any) -> float:
    """The temperature ``model``'s calibrated probabilities divide its logits by: its config's (a vitlab model, or
    an exported folder's: :func:`vitlab.deploy.open_exported` sets it), else 1.0 (a model without one)."""
    extra = getattr(getattr(model, "config", None), "extra", None)
    return (checked_temperature(extra.get(TEMPERATURE_KEY)) if isinstance(extra, dict) else None) or 1.0


def probabilities(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``softmax(logits / temperature)`` over the last dimension, in float32: the calibrated probabilities (the
    argmax is the logits' own for any ``temperature > 0``)."""
    return (logits.float() / float(temperature)).softmax(-1)


def bake_temperature(model: nn.Module, temperature: float) -> nn.Module:
    """A copy of ``model`` whose logits are its own divided by ``temperature``: the classifier's weights and bias
    (``head``, and DeiT's ``head_dist``, which evaluation averages with it) scaled by ``1 / temperature``, so an
    exported graph gives the calibrated logits with no new operator (``softmax`` of its output: the calibrated
    probabilities). ``model`` itself is not changed; ``temperature == 1``: the copy is the model's arithmetic."""
    baked = copy.deepcopy(model)
    if temperature == 1.0:
        return baked
    with torch.no_grad():
        for name in ("head", "head_dist"):
            layer = getattr(baked, name, None)
            if isinstance(layer, nn.Linear):
                layer.weight.div_(temperature)
                if layer.bias is not None:
                    layer.bias.div_(temperature)
    return baked


@dataclass
class Reliability:
    """Counts of a reliability diagram: per confidence bin, the images, their summed top-1 confidence and their
    correct predictions. Summed over batches (and processes: :meth:`tensor`), from which the ECE follows."""

    bins: int = ECE_BINS
    count: np.ndarray = field(init=False)
    confidence: np.ndarray = field(init=False)
    correct: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.count = np.zeros(self.bins, dtype=np.float64)
        self.confidence = np.zeros(self.bins, dtype=np.float64)
        self.correct = np.zeros(self.bins, dtype=np.float64)

    def add(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        """Count ``(N, C)`` probabilities with their labels: bin ``b`` holds the confidences in ``(b/B, (b+1)/B]``."""
        conf, pred = probs.detach().max(dim=1)  # (in the probabilities' own precision: no rounding across an edge)
        conf = conf.double().cpu().numpy()
        hit = (pred.cpu() == labels.detach().cpu().long()).numpy().astype(np.float64)
        idx = np.clip(np.ceil(conf * self.bins).astype(np.int64) - 1, 0, self.bins - 1)
        self.count += np.bincount(idx, minlength=self.bins)
        self.confidence += np.bincount(idx, weights=conf, minlength=self.bins)
        self.correct += np.bincount(idx, weights=hit, minlength=self.bins)

    def tensor(self) -> torch.Tensor:
        """The counts as one ``(3, bins)`` float64 tensor (to sum over processes)."""
        return torch.from_numpy(np.stack([self.count, self.confidence, self.correct]))

    def load(self, t: torch.Tensor) -> Reliability:
        """The counts from :meth:`tensor`'s layout (summed over processes); returns self."""
        a = t.detach().cpu().double().numpy()
        self.count, self.confidence, self.correct = a[0].copy(), a[1].copy(), a[2].copy()
        return self

    @property
    def images(self) -> int:
        return int(self.count.sum())

    def ece(self) -> float | None:
        """The expected calibration error: ``sum_b |correct_b - confidence_b| / N``; None without images."""
        n = self.count.sum()
        return float(np.abs(self.correct - self.confidence).sum() / n) if n else None

    def to_dict(self) -> dict[str, Any]:
        """``{"bins", "count", "confidence", "accuracy"}``: per bin, its images, their mean confidence and accuracy
        (None for an empty bin): the points of a reliability diagram."""
        n = np.maximum(self.count, 1)
        return {
            "bins": self.bins,
            "count": [int(c) for c in self.count],
            "confidence": [round(float(v), 6) if c else None for v, c in zip(self.confidence / n, self.count)],
            "accuracy": [round(float(v), 6) if c else None for v, c in zip(self.correct / n, self.count)],
        }


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, *, bins: int = ECE_BINS) -> float | None:
    """The ECE of ``(N, C)`` probabilities against ``labels`` over ``bins`` equal-width bins of top-1 confidence
    (Guo et al. 2017, Eq. 3); None for no images."""
    r = Reliability(bins)
    r.add(probs, labels)
    return r.ece()


def _finite_rows(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keep = torch.isfinite(logits).all(dim=1)
    return logits[keep], labels[keep]


def _slope(z: torch.Tensor, zy: torch.Tensor, beta: float) -> float:
    """d/d(beta) of the mean NLL of ``softmax(beta * z)``: ``mean(E_p[z] - z_y)``, in chunks of rows."""
    rows = max(1, _CHUNK // max(1, z.shape[1]))
    total = 0.0
    for s in range(0, len(z), rows):
        zc = z[s : s + rows]
        total += float(((beta * zc).softmax(1) * zc).sum())
    return (total - float(zy.sum())) / len(z)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature ``T`` in [:data:`T_MIN`, :data:`T_MAX`] minimising the NLL of ``labels`` under
    ``softmax(logits / T)`` (temperature scaling). With ``beta = 1 / T`` the NLL is convex in ``beta`` (a log-sum-exp
    of linear functions less a linear one), so its slope rises with ``beta`` and the minimum is where the slope
    crosses zero: found by bisection over ``log beta`` (a 1-D search, exact and deterministic; no learning rate, no
    iteration budget to tune). Rows with a non-finite logit are left out. 1.0 where nothing can be fitted: no images,
    one class, or logits that do not depend on the image's class (all equal: every ``T`` gives the same NLL)."""
    z, y = _finite_rows(logits.detach().double().cpu(), labels.detach().cpu().long())
    if len(z) == 0 or z.shape[1] < 2 or float((z.max(1).values - z.min(1).values).max()) == 0.0:
        return 1.0
    zy = z.gather(1, y[:, None])[:, 0]
    lo, hi = math.log(1 / T_MAX), math.log(1 / T_MIN)  # log beta
    if _slope(z, zy, math.exp(lo)) >= 0:
        return T_MAX
    if _slope(z, zy, math.exp(hi)) <= 0:
        return T_MIN
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        if _slope(z, zy, math.exp(mid)) < 0:
            lo = mid
        else:
            hi = mid
    t = 1 / math.exp((lo + hi) / 2)
    return t if math.isfinite(t) else 1.0


def _nll(z: torch.Tensor, y: torch.Tensor, t: float) -> float:
    """The mean NLL of ``y`` under ``softmax(z / t)`` (float64; rows with a non-finite logit left out)."""
    z, y = _finite_rows(z.double(), y.long())
    return float(torch.nn.functional.cross_entropy(z / t, y)) if len(z) else 0.0


def temperature_pays(logits: torch.Tensor, labels: torch.Tensor) -> bool:
    """Whether a temperature fitted on these images lowers the NLL of images that did not fit it: each half (every
    other image) fits one, scored on the other half against ``T = 1``, the two changes summed (2-fold cross-fitting
    within the fitting images, see the module's notes). False with fewer than two images a half."""
    z, y = logits.detach().float().cpu(), labels.detach().cpu().long()
    a, b = slice(0, None, 2), slice(1, None, 2)
    if min(len(z[a]), len(z[b])) < 2:
        return False
    ta, tb = fit_temperature(z[a], y[a]), fit_temperature(z[b], y[b])
    change = _nll(z[b], y[b], ta) - _nll(z[b], y[b], 1.0) + _nll(z[a], y[a], tb) - _nll(z[a], y[a], 1.0)
    return change < 0


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` found: the temperature, the ECE with it (``ece``) and without (``ece_uncalibrated``)
    on the images that did not fit it, how many fitted and measured, and both reliability diagrams."""

    temperature: float
    fitted: float
    """The temperature the fitting half's NLL chose; ``temperature`` is it when it paid out of sample, else 1."""
    ece: float | None
    ece_uncalibrated: float | None
    fit_images: int
    ece_images: int
    reliability: dict[str, Any]
    reliability_uncalibrated: dict[str, Any]
    why_not: str | None = None
    """Why ``fitted`` was not kept (``temperature`` 1): it did not pay out of sample, or the fit found no minimum."""

    def scalars(self) -> dict[str, Any]:
        """``temperature``, ``ece`` and ``ece_uncalibrated``: what a model's ``config.json``, ``metrics.jsonl`` and
        ``summary.json`` carry."""
        return {"temperature": self.temperature, "ece": self.ece, "ece_uncalibrated": self.ece_uncalibrated}

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.scalars(),
            "fitted_temperature": self.fitted,
            "why_not": self.why_not,
            "bins": ECE_BINS,
            "fit_images": self.fit_images,
            "ece_images": self.ece_images,
            "held_out": HELD_OUT,
            "reliability": self.reliability,
            "reliability_uncalibrated": self.reliability_uncalibrated,
        }


def calibrate(logits: torch.Tensor, labels: torch.Tensor, *, bins: int = ECE_BINS) -> Calibration:
    """Fit one temperature on the images at even positions of ``logits`` ``(N, C)`` (the evaluation's order) and
    measure the ECE with it and without it on the images at odd positions (see the module's notes: never the images
    that fitted it)."""
    z = logits.detach().float().cpu()
    y = labels.detach().cpu().long()
    fit, rest = slice(0, None, 2), slice(1, None, 2)
    fitted = fit_temperature(z[fit], y[fit])
    zf, yf = _finite_rows(z[fit], y[fit])
    why_not = None
    if len(zf) and bool((zf.argmax(1) == yf).all()) and fitted <= T_MIN:  # (no minimum: sharper is always better)
        why_not = f"every fitting image is right, so their NLL has no minimum, only the search's bound {T_MIN}"
    elif not temperature_pays(z[fit], y[fit]):
        why_not = "it did not pay out of sample"
    t = 1.0 if why_not else fitted
    zr, yr = _finite_rows(z[rest], y[rest])
    cal, raw = Reliability(bins), Reliability(bins)
    if len(zr):
        cal.add(probabilities(zr, t), yr)
        raw.add(probabilities(zr), yr)
    return Calibration(
        temperature=t,
        fitted=fitted,
        ece=cal.ece(),
        ece_uncalibrated=raw.ece(),
        fit_images=len(z[fit]),
        ece_images=len(zr),
        reliability=cal.to_dict(),
        reliability_uncalibrated=raw.to_dict(),
        why_not=why_not,
    )


class LogitKeeper:
    """The logits and labels of an evaluation, in its order, for the temperature fit, within
    :data:`MAX_KEPT_LOGITS` values: when they would pass it, every other image kept so far is let go and from then
    on every other one of the rest (then every fourth ...), so what is kept is evenly spread over the whole split
    and the same for the same evaluation (deterministic; no random draw)."""

    def __init__(self, max_values: int = MAX_KEPT_LOGITS) -> None:
        self.max_values = max_values
        self.stride = 1
        self.seen = 0
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (positions, logits, labels)

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        n = len(logits)
        pos = torch.arange(self.seen, self.seen + n)
        self.seen += n
        keep = pos % self.stride == 0
        z = logits.detach().float().cpu()
        self.parts.append((pos[keep], z[keep], labels.detach().cpu()[keep]))
        classes = max(1, logits.shape[1]) if logits.ndim == 2 else 1
        while sum(len(p) for p, _, _ in self.parts) * classes > self.max_values and self.stride < self.seen:
            self.stride *= 2
            thinned = []
            for p, z, y in self.parts:
                m = p % self.stride == 0
                thinned.append((p[m], z[m], y[m]))
            self.parts = thinned

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits (N, C) float32, labels (N,))`` kept, in the evaluation's order."""
        if not self.parts:
            return torch.zeros(0, 0), torch.zeros(0, dtype=torch.int64)
        return torch.cat([z for _, z, _ in self.parts]), torch.cat([y for _, _, y in self.parts]).long()
