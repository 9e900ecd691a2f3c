"""Moved to :mod:`vitlab.train.spec` (this name goes when every caller has moved)."""

from .spec.config import TrainConfig
from .spec.resume import resumed_config
from .spec.rules import validate as validate_config

__all__ = ["TrainConfig", "resumed_config", "validate_config"]
