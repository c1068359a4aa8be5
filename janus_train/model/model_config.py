"""What the JanusVLN model (:mod:`janus_train.model.janus_model`) is built with: its new modules' sizes and seed,
and which parameter sets train; and the loss's settings (:mod:`janus_train.model.loss` computes it): the
action-head weight's schedule and the token-logit chunk. Torch-free, so a profile's settings load without torch."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_LOGIT_CHUNK_ROWS = 1024
"""Rows of token logits alive at once (1024 x 152k float32 = 620 MB at Qwen's vocabulary)."""


@dataclass(frozen=True)
class TrainableParts:
    """Which parameter sets train (see :data:`janus_train.model.janus_model.PARTS`); the VGGT encoder never does."""

    language_model: bool = True
    projector: bool = True
    vision_tower: bool = False
    vggt_merger: bool = True
    action_head: bool = True


@dataclass(frozen=True)
class JanusModelConfig:
    """``lam`` scales the injected 3-D embedding; ``merger_hidden`` is the VGGT merger's inner width
    (4096 in JanusVLN); ``init_seed`` seeds the new modules' initial weights (same on every rank);
    ``logit_chunk_rows`` bounds the token-logit rows alive at once."""

    lam: float = 0.2
    merger_hidden: int = 4096
    action_hidden: int = 512
    trainable: TrainableParts = field(default_factory=TrainableParts)
    init_seed: int = 0
    logit_chunk_rows: int = DEFAULT_LOGIT_CHUNK_ROWS


@dataclass(frozen=True)
class LossConfig:
    """The action-head term's weight ``d``: ``distill_loss_weight``, or, when
    ``distill_loss_weight_end`` is set and ``distill_loss_weight_warmup_steps > 0``, a linear ramp
    from ``distill_loss_weight`` at optimizer step 0 to ``distill_loss_weight_end`` at step
    ``distill_loss_weight_warmup_steps``, constant after (the reference trainer's schedule).

    The token weights are not here: they come per token with the batch (``loss_weights``).
    """

    distill_loss_weight: float = 1.0
    distill_loss_weight_end: float | None = None
    distill_loss_weight_warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.distill_loss_weight < 0:
            raise ValueError(f"distill_loss_weight must be >= 0, got {self.distill_loss_weight}")
        if self.distill_loss_weight_end is not None and self.distill_loss_weight_end < 0:
            raise ValueError(f"distill_loss_weight_end must be >= 0, got {self.distill_loss_weight_end}")
        if self.distill_loss_weight_warmup_steps < 0:
            raise ValueError(
                f"distill_loss_weight_warmup_steps must be >= 0, got {self.distill_loss_weight_warmup_steps}"
            )

    @property
    def ramps(self) -> bool:
        return self.distill_loss_weight_end is not None and self.distill_loss_weight_warmup_steps > 0

    def distill_weight_at(self, step: int) -> float:
        """Weight of the action-head term at optimizer step ``step`` (0-based)."""
        if not self.ramps:
            return self.distill_loss_weight
        assert self.distill_loss_weight_end is not None
        progress = min(1.0, max(step, 0) / self.distill_loss_weight_warmup_steps)
        return self.distill_loss_weight + (self.distill_loss_weight_end - self.distill_loss_weight) * progress
