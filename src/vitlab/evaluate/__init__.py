"""Evaluation: accuracy (top-1, top-5, per class) of a model on a dataset."""

from .accuracy import evaluate_batches, evaluate_model, preprocess_for

__all__ = ["evaluate_batches", "evaluate_model", "preprocess_for"]
