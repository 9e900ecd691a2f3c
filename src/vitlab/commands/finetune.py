"""``vitlab finetune``: fine-tune a model on new data, as in Sec. 3.2 of the paper."""

from __future__ import annotations

import argparse

from ..train.spec.parser import add_options
from .train import run


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune a model on new data (new head, higher resolution)",
        description=(
            "Fine-tune a trained model as in Sec. 3.2 of the paper: the pre-trained head is replaced by a\n"
            "zero-initialised linear layer when the classes differ (or the model has the pre-training MLP head),\n"
            "and at a new --img-size the position embeddings are resampled by 2-D interpolation. --patch-size P\n"
            "resizes the patch projection to P x P by FlexiViT's pseudo-inverse resize (Beyer et al. 2023).\n"
            "Default recipe: finetune (SGD momentum 0.9, no weight decay, clipping at 1, warmup + cosine; the batch\n"
            "shrinks to at most 1/16 of a small dataset, the LR with its square root). --layer-decay 0.75: layer-wise\n"
            "LR decay; --freeze (--linear-probe): train the head only; --head-warmup STEPS: the head only for\n"
            "STEPS steps, then every weight (LP-FT).\n\n"
            "examples:\n"
            "  vitlab finetune --init runs/digits/model --data path/to/imagefolder --img-size 16 --epochs 5\n"
            "  vitlab finetune --init runs/cifar/model --data path/to/cifar10 --img-size 48 --time-budget 5m"
        ),
        formatter_class=formatter,
    )
    add_options(p, command="finetune")
    p.set_defaults(func=run)
