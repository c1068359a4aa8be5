"""The formats janus exports a trained model in (:mod:`janus_train.checkpoint.export` writes them),
as ``janus-train export --format`` and ``train.eval_export`` name them. Torch-free, so a profile's
settings load without torch.

``janus``: a transformers-5 directory of the run's base plus janus's heads; ``janusvln``: JanusVLN's
reference checkpoint layout, which is Qwen2.5-VL's only."""

from __future__ import annotations

from janus_core.bases import QWEN2_5_VL, QwenBase

JANUS, JANUSVLN = "janus", "janusvln"
FORMATS: tuple[str, ...] = (JANUS, JANUSVLN)
JANUSVLN_BASE: QwenBase = QWEN2_5_VL
"""The one base whose model the ``janusvln`` layout holds."""


def natural_format(base: QwenBase) -> str:
    """The format a base's model is exported in by default: JanusVLN's reference layout for
    Qwen2.5-VL, transformers' own for another base."""
    return JANUSVLN if base is JANUSVLN_BASE else JANUS
