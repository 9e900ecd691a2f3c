"""Evaluation: accuracy (top-1, top-5, per class) of a model on a dataset, the usual way (resize, centre crop) or at
each image's own aspect ratio (packed: :func:`evaluate_native`); how well its probabilities are calibrated
(:mod:`.calibration`: temperature scaling, the ECE); and which training labels its features contradict
(:mod:`.label_issues`: confident learning on cross-validated linear probes)."""

from .accuracy import (
    decode_size,
    eval_dataset,
    evaluate_batches,
    evaluate_model,
    model_inputs,
    preprocess_for,
    transforms_for,
)
from .calibration import calibrate, expected_calibration_error, fit_temperature, model_temperature, probabilities
from .label_issues import folder_ranking, label_issue_findings, out_of_sample_probabilities, rank_label_issues
from .own_aspect import evaluate_native, native_batches, native_inputs, native_patchify

__all__ = [
    "calibrate",
    "decode_size",
    "eval_dataset",
    "evaluate_batches",
    "evaluate_model",
    "evaluate_native",
    "expected_calibration_error",
    "fit_temperature",
    "folder_ranking",
    "label_issue_findings",
    "model_inputs",
    "model_temperature",
    "native_batches",
    "native_inputs",
    "native_patchify",
    "out_of_sample_probabilities",
    "preprocess_for",
    "probabilities",
    "rank_label_issues",
    "transforms_for",
]
