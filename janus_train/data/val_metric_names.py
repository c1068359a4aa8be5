"""The names of the validation metrics (:mod:`janus_train.loop.validation` computes them) and which way
each is better: what the ``train.best_metric`` setting may name and what keeps a checkpoint in
``checkpoints/best``. Torch-free, so a profile's settings load without torch.

``train.best_metric`` may also name a metric of an external evaluation, ``eval/<NAME>``
(:mod:`janus_train.evals`): janus cannot know which way such a metric is better, so its direction is
``train.best_metric_mode`` (``max`` or ``min``), which the validation metrics do not need."""

from __future__ import annotations

import math

from janus_train.data.segments import SEGMENT_NAMES

VAL_LOSS = "val_loss"
HIGHER_IS_BETTER: tuple[str, ...] = ("val_action_accuracy", "val_action_token_accuracy")
BEST_METRICS: tuple[str, ...] = (VAL_LOSS, "val_token_loss", "val_action_loss", *HIGHER_IS_BETTER,
                                 *(f"val_loss_{name}" for name in SEGMENT_NAMES))
"""Validation metrics ``best_metric`` may name: accuracies are best highest, losses lowest."""

EVAL_PREFIX = "eval/"
"""An external evaluation's metric ``NAME`` is logged, and named by ``best_metric``, as ``eval/NAME``."""

BEST_MODES: tuple[str, ...] = ("max", "min")
"""``train.best_metric_mode``: the best value of the metric is its highest (max) or its lowest (min)."""


def is_eval_metric(metric: str) -> bool:
    return metric.startswith(EVAL_PREFIX)


def best_metric_name(value: str) -> str:
    """``train.best_metric`` checked: a validation metric or ``eval/<NAME>`` (ValueError otherwise)."""
    if value in BEST_METRICS or (is_eval_metric(value) and value != EVAL_PREFIX):
        return value
    raise ValueError(f"{value!r} is not a metric janus keeps a best checkpoint by; expected one of "
                     f"{', '.join(BEST_METRICS)}, or {EVAL_PREFIX}<NAME> (a metric of train.eval_command's results)")


def best_mode_problem(metric: str, mode: str | None) -> str | None:
    """Why ``best_metric`` and ``best_metric_mode`` do not go together (None when they do): an
    evaluation's metric needs a mode; a validation metric has its own direction, which a mode given
    must repeat."""
    if is_eval_metric(metric):
        if mode is None:
            return (f"setting 'train.best_metric' is {metric!r}, a metric of the evaluator's results, whose better "
                    "direction janus cannot know: set train.best_metric_mode to max or min")
        return None
    own = "max" if metric in HIGHER_IS_BETTER else "min"
    if mode is not None and mode != own:
        return (f"setting 'train.best_metric_mode' is {mode!r}, but {metric} is best at its "
                f"{'highest' if own == 'max' else 'lowest'} ({own}); leave train.best_metric_mode out for a "
                "validation metric")
    return None


def better(metric: str, new: float, old: float | None, mode: str | None = None) -> bool:
    """Whether ``new`` beats ``old`` (None: nothing yet) for ``metric``; ties keep the old one.
    ``mode`` (``max``/``min``): the direction of an evaluation's metric (a validation metric has its own)."""
    if not math.isfinite(new):
        return False
    if old is None:
        return True
    higher = metric in HIGHER_IS_BETTER if mode is None else mode == "max"
    return new > old if higher else new < old
