"""Evaluation: accuracy (top-1, top-5, per class) of a model on a dataset, the usual way (resize, centre crop) or at
each image's own aspect ratio (packed: :func:`evaluate_native`)."""

from .accuracy import (
    decode_size,
    eval_dataset,
    evaluate_batches,
    evaluate_model,
    model_inputs,
    preprocess_for,
    transforms_for,
)
from .own_aspect import evaluate_native, native_batches, native_inputs, native_patchify

__all__ = [
    "decode_size",
    "eval_dataset",
    "evaluate_batches",
    "evaluate_model",
    "evaluate_native",
    "model_inputs",
    "native_batches",
    "native_inputs",
    "native_patchify",
    "preprocess_for",
    "transforms_for",
]
