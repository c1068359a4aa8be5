"""What the JanusVLN model (:mod:`janus_train.model.janus_model`) is built with: its new modules' sizes and seed,
and which parameter sets train. Torch-free, so a profile's settings load without torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from janus_train.model.loss_config import DEFAULT_LOGIT_CHUNK_ROWS


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
