"""``vitlab finetune``: fine-tune a model on new data, as in Sec. 3.2 of the paper."""

from __future__ import annotations

import argparse

from ..train.conf.parser import add_options
from .train import run


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune a model on new data (new head, higher resolution)",
        description=(
            "Fine-tune a trained model as in Sec. 3.2 of the paper: the pre-trained head is kept only when its\n"
            "classes are the data's (the same names in the same order; --new-head: never), else replaced by a\n"
            "zero-initialised linear layer; at a new --img-size the position embeddings are resampled by 2-D\n"
            "interpolation. --patch-size P resizes the patch projection to P x P by FlexiViT's pseudo-inverse\n"
            "resize (Beyer et al. 2023).\n"
            "Default recipe: auto, fitted to the data, the budget and the model (AdamW at an LR for its width,\n"
            "clipping at 1, warmup + cosine, augmentation for the passes, token dropping under --time-budget, a\n"
            "new head trained alone first on small data); --recipe finetune: the paper's SGD recipe.\n"
            "--layer-decay 0.75: layer-wise LR decay; --freeze (--linear-probe): train the head only;\n"
            "--head-warmup STEPS: the head only for STEPS steps, then every weight (LP-FT).\n\n"
            "examples:\n"
            "  vitlab finetune --init runs/digits/model --data path/to/imagefolder --img-size 16 --epochs 5\n"
            "  vitlab finetune --init runs/cifar/model --data path/to/photos --time-budget 5m\n"
            "  vitlab finetune --init runs/cifar/model --data path/to/photos --time-budget 5m --freeze   # linear probe"
        ),
        formatter_class=formatter,
    )
    add_options(p, command="finetune")
    p.set_defaults(func=run)
