"""The names of the validation metrics (:mod:`janus_train.loop.validation` computes them) and which way
each is better: what the ``train.best_metric`` setting may name and what keeps a checkpoint in
``checkpoints/best``. Torch-free, so a profile's settings load without torch."""

from __future__ import annotations

import math

from janus_train.data.segments import SEGMENT_NAMES

VAL_LOSS = "val_loss"
HIGHER_IS_BETTER: tuple[str, ...] = ("val_action_accuracy", "val_action_token_accuracy")
BEST_METRICS: tuple[str, ...] = (VAL_LOSS, "val_token_loss", "val_action_loss", *HIGHER_IS_BETTER,
                                 *(f"val_loss_{name}" for name in SEGMENT_NAMES))
"""Metrics ``best_metric`` may name: accuracies are best highest, losses lowest."""


def better(metric: str, new: float, old: float | None) -> bool:
    """Whether ``new`` beats ``old`` (None: nothing yet) for ``metric``; ties keep the old one."""
    if not math.isfinite(new):
        return False
    if old is None:
        return True
    return new > old if metric in HIGHER_IS_BETTER else new < old
