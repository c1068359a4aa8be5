"""The four answer lines of a training sample's target, its *segments*: the prompt builds them
(:mod:`janus_train.data.prompt`), the loss weighs them and validation reports a loss per line. Line k
(1-based) is segment k whatever the prompt template; torch-free, so settings that name a segment's
metric load without torch."""

from __future__ import annotations

ANSWER_LABELS: tuple[str, ...] = ("SUBINSTRUCTION:", "2D_DESCRIPTION:", "3D_DESCRIPTION:", "ACTION:")
"""Markers of the four target lines; line k (1-based) is segment k."""
SEGMENT_NAMES: tuple[str, ...] = ("subinstruction", "description_2d", "description_3d", "action")
N_SEGMENTS = len(ANSWER_LABELS)
