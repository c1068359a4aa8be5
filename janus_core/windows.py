"""The history-window rule: which frames of an episode a training sample sees.

A sample at frame ``j`` of an episode sees ``history`` earlier frames plus frame ``j`` itself
(``history + 1`` images, the current view last):

* ``j <= history``: frames ``0..j``, front-padded by repeating frame 0, so the window still
  holds ``history + 1`` entries;
* ``j > history``: ``linspace(0, j, history + 1)`` rounded down, which always includes 0 and ``j``.

Frame ids are frame indices within the episode (for the episode-folder format the step number;
see :mod:`janus_core.index`). The rule must reproduce the reference exactly, including its
float rounding: the reference computes ``numpy.linspace(0, j, n).astype(int)``, so we evaluate
the same IEEE-754 double expressions numpy does (``i * (j / (n - 1))`` with the last point set to
``j``) instead of exact rational arithmetic, which could round differently for some ``history``.
"""

from __future__ import annotations

from typing import Literal, get_args

DEFAULT_HISTORY = 8
"""History frames per sample in JanusVLN (``max_history_images``); 9 images per sample."""

# The window variant's two choices live here, torch-free, so that reading a profile or a cache's
# manifest does not import the VGGT package (and torch) for them.

# Global attention over a window: block-causal (frame i sees frames <= i, JanusVLN's streaming
# setting) or full (every frame sees every frame, offline VGGT).
AttentionMode = Literal["causal", "full"]
ATTENTION_MODES: tuple[str, ...] = get_args(AttentionMode)

# The frame of a window whose patch tokens are the window's feature.
ReferenceFrame = Literal["first", "last"]
REFERENCE_FRAMES: tuple[str, ...] = get_args(ReferenceFrame)


def window_frames(step: int, history: int = DEFAULT_HISTORY) -> tuple[int, ...]:
    """Frame indices of the window of the sample at frame ``step``; length ``history + 1``.

    >>> window_frames(3)
    (0, 0, 0, 0, 0, 0, 1, 2, 3)
    >>> window_frames(20)
    (0, 2, 5, 7, 10, 12, 15, 17, 20)
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"window step must be a non-negative int, got {step!r}")
    if isinstance(history, bool) or not isinstance(history, int) or history < 1:
        raise ValueError(f"window history must be a positive int, got {history!r}")
    if step <= history:
        return (0,) * (history - step) + tuple(range(step + 1))
    # Same double-precision operations as numpy.linspace(0, step, history + 1) (start 0, so no
    # offset); int() truncates like astype(int), which is floor for these non-negative values.
    delta = step / history
    return tuple(int(i * delta) for i in range(history)) + (step,)
