"""The non-finite guard's verdict: a step whose loss or gradient norm is NaN/inf, told in one line.

The trainer decides (``train.nonfinite``: stop or skip); this module names the step, the rank(s)
and the samples so that a user can find the bad sample in the cache.
"""

from __future__ import annotations

import math


class NonFiniteStep(RuntimeError):
    """A step's loss or gradient norm was NaN/inf (``train.nonfinite: stop``); raised on every rank
    with the same message, after nothing of the step was saved or logged."""


def nonfinite_message(step: int, loss: float, grad_norm: float, per_rank: list[tuple[bool, list[str], list[str]]],
                      nonfinite_skip: bool) -> str:
    """The one-line report of a non-finite step. ``per_rank[r]``: (rank r's loss was non-finite,
    keys of its micro-batches with a non-finite loss, keys of all its micro-batches)."""
    ranks = [r for r, (bad, _, _) in enumerate(per_rank) if bad]
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    if ranks:
        where = "; ".join(f"rank {r} (samples {', '.join(per_rank[r][1])})" for r in ranks)
    else:  # only the gradient norm: the step's samples on every rank
        where = "one of " + "; ".join(f"rank {r} (samples {', '.join(keys)})"
                                      for r, (_, _, keys) in enumerate(per_rank))
    why = (" (the gradients were finite, so the optimizer step was applied and could not be skipped)"
           if nonfinite_skip else "")
    return (f"non-finite {what} at step {step} (loss {loss}, gradient norm {grad_norm}) on {where}; "
            f"stopped on every rank, nothing of step {step} was saved{why}")
