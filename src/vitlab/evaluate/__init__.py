"""Evaluation: accuracy (top-1, top-5, per class) of a model on a dataset."""

from .accuracy import (
    decode_size,
    eval_dataset,
    evaluate_batches,
    evaluate_model,
    model_inputs,
    preprocess_for,
    transforms_for,
)

__all__ = [
    "decode_size",
    "eval_dataset",
    "evaluate_batches",
    "evaluate_model",
    "model_inputs",
    "preprocess_for",
    "transforms_for",
]
