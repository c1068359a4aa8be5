"""Damaged cache data met by the trainer, told in one line (``train.damaged_samples: stop``).

The cached datasets hand damaged samples over as values (:class:`janus_train.data.DamagedItem`),
the trainer gathers them once per step from every rank; this module names the first one.
"""

from __future__ import annotations


class DamagedSample(RuntimeError):
    """Training met damaged cache data with ``train.damaged_samples: stop``; raised on every rank with
    the same one-line message (the file and sample), before anything of that step was trained."""


def damaged_message(step: int, per_rank: list[list[str]], total: int) -> str:
    """The report of a step whose micro-batches met ``total`` damaged samples; ``per_rank[r]``: the
    one-line errors rank r met (the first one is named)."""
    rank, first = next((r, lines[0]) for r, lines in enumerate(per_rank) if lines)
    return (f"step {step}, rank {rank}: {first} ({total} damaged sample(s) in the step; stopped on every rank "
            "before training on it, train.damaged_samples: skip would leave them out)")
