"""``train.eval_command`` filled per checkpoint (its placeholders are declared and checked with the
setting, :data:`janus_train.config.EVAL_PLACEHOLDERS`), and what janus writes for the evaluator
(``train.eval_export``)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from janus_core.bases import QwenBase
from janus_train.config import NO_EXPORT, PLACEHOLDER
from janus_train.model.export_formats import natural_format


def fill_command(command: str, values: Mapping[str, str | Path | int]) -> str:
    """``command`` with each placeholder replaced by its value, quoted for the shell (paths may hold
    spaces); other text unchanged."""
    return PLACEHOLDER.sub(lambda m: shlex.quote(str(values[m.group(1)])) if m.group(1) in values else m.group(0),
                           command)


def export_format(setting: str | None, base: QwenBase) -> str | None:
    """What janus exports for the evaluator: ``train.eval_export``, by default the base's natural
    format (JanusVLN's reference layout for Qwen2.5-VL, transformers' own for another base); None
    for ``none``."""
    chosen = setting or natural_format(base)
    return None if chosen == NO_EXPORT else chosen
