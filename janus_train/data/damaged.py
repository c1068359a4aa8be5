"""Damaged cache data met by the trainer, told in one line (``train.damaged_samples: stop``).

The cached datasets hand damaged samples over as values (:class:`janus_train.data.samples.DamagedItem`),
the trainer draws a step's micro-batches with :func:`draw_step`, which makes every rank agree on the
damage met (a rank never draws on alone while another waits in a collective) and names the first one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from janus_core.plural import plural


class DamagedSample(RuntimeError):
    """Training met damaged cache data with ``train.damaged_samples: stop``; raised on every rank with
    the same one-line message (the file and sample), before anything of that step was trained."""


def damaged_message(step: int, per_rank: list[list[str]], total: int) -> str:
    """The report of a step whose micro-batches met ``total`` damaged samples; ``per_rank[r]``: the
    one-line errors rank r met (the first one is named)."""
    rank, first = next((r, lines[0]) for r, lines in enumerate(per_rank) if lines)
    return (f"step {step}, rank {rank}: {first} ({plural(total, 'damaged sample')} in the step; stopped on every rank "
            "before training on it, train.damaged_samples: skip would leave them out)")


class Collective(Protocol):
    """What the ranks agree through (the trainer's process group; a single process in tests)."""

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over every rank."""

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, by rank."""


@dataclass(frozen=True)
class StepDraw:
    """A step's micro-batches of this rank and the damaged samples every rank left out drawing them."""

    micro: list[tuple[dict[str, Any], int, int]]
    skipped: int


def draw_step(batches: Iterator[tuple[dict[str, Any], int, int]], grad_accum: int, epoch_draws: int,
              policy: str, collective: Collective, step: int) -> StepDraw:
    """This rank's ``grad_accum`` micro-batches of step ``step``, every rank agreeing on the damage met.

    ``batches`` yields (micro-batch, epoch, position) and also the micro-batches whose every sample
    was damaged (no ``"keys"``), so that a rank whose data is damaged never draws on alone while the
    others wait for it in a collective: after each round of draws the ranks sum what they met.
    ``stop`` raises :class:`DamagedSample` on every rank at the first damage; ``skip`` draws again
    where micro-batches are missing, until every rank has its ``grad_accum``; a rank that drew
    ``epoch_draws`` (an epoch of its micro-batches) in a row without a readable sample stops every
    rank too, as there is nothing left to train on.
    """
    micro: list[tuple[dict[str, Any], int, int]] = []
    skipped = barren = 0
    while True:
        seen: list[Any] = []
        while len(micro) < grad_accum and barren < epoch_draws:
            drawn = next(batches)
            seen.extend(drawn[0].pop("damaged", []))
            if "keys" in drawn[0]:
                micro.append(drawn)
                barren = 0
            else:
                barren += 1
        exhausted = barren >= epoch_draws
        damaged, missing, none_left = collective.sum(
            [float(sum(err.samples for err in seen)), float(grad_accum - len(micro)), float(exhausted)])
        if damaged and (policy == "stop" or none_left):
            per_rank = collective.gather((exhausted, [str(err) for err in seen]))
            if policy == "stop":
                raise DamagedSample(damaged_message(step, [lines for _, lines in per_rank], int(damaged)))
            # The rank that ran out met damage in this round's draws (a barren draw holds only damage).
            rank = next(r for r, (out, _) in enumerate(per_rank) if out)
            raise DamagedSample(
                f"step {step}, rank {rank}: {per_rank[rank][1][0]} (a whole epoch of this rank's samples drawn "
                "without a readable one: train.damaged_samples: skip has nothing left to train on)")
        skipped += int(damaged)
        if not missing:
            return StepDraw(micro, skipped)
