"""Damaged cache data, and reads that stall, met by the trainer, told in one line
(``train.damaged_samples: stop``; ``train.read_timeout_s``).

The cached datasets hand damaged samples over as values (:class:`janus_train.data.samples.DamagedItem`),
and so do the datasets :func:`within_read_timeout` wraps with a sample whose read did not return in
time (:class:`StalledItem`: the read is bounded where it waits, in the loader worker or the rank
itself, :mod:`janus_cache.store.stalls`). The trainer draws a step's micro-batches with
:func:`draw_step`, which makes every rank agree on the damage and the stalls met (a rank never draws
on alone while another waits in a collective) and names the first one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from janus_core.plural import plural
from torch.utils.data import Dataset, IterableDataset

from janus_cache.store.stalls import StalledRead, read_deadline


class DamagedSample(RuntimeError):
    """Training met damaged cache data with ``train.damaged_samples: stop``; raised on every rank with
    the same one-line message (the file and sample), before anything of that step was trained."""


class StalledSample(RuntimeError):
    """A sample's read did not return within ``train.read_timeout_s`` on some rank; raised on every
    rank with the same one-line message (the rank and the file it waits on)."""


@dataclass(frozen=True)
class StalledItem:
    """A sample whose read stalled, in its place (a value, so it crosses a DataLoader worker)."""

    error: StalledRead


class _MapWithin(Dataset[Any]):
    def __init__(self, dataset: Dataset[Any], seconds: float) -> None:
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        try:
            with read_deadline(self.seconds):
                return self.dataset[index]
        except StalledRead as err:
            return StalledItem(err)


class _StreamWithin(IterableDataset[Any]):
    def __init__(self, dataset: IterableDataset[Any], seconds: float) -> None:
        self.dataset, self.seconds = dataset, seconds

    def __iter__(self) -> Iterator[Any]:
        samples = iter(self.dataset)
        while True:
            try:
                with read_deadline(self.seconds):
                    sample = next(samples)
            except StopIteration:
                return
            except StalledRead as err:
                yield StalledItem(err)
                return  # the stream's reader is stuck in the stalled read
            yield sample


def within_read_timeout(dataset: Dataset[Any], seconds: float) -> Dataset[Any]:
    """``dataset`` whose every sample's read is bounded by ``seconds`` (``train.read_timeout_s``; 0:
    as it is): a read that stalls longer becomes a :class:`StalledItem`, where the read is waited
    for (a loader worker or the rank)."""
    if seconds <= 0:
        return dataset
    return _StreamWithin(dataset, seconds) if isinstance(dataset, IterableDataset) else _MapWithin(dataset, seconds)


def stalled_message(where: str, per_rank: list[list[str]]) -> str:
    """The report of reads that stalled at ``where`` (a step, or validation); ``per_rank[r]``: the
    one-line errors rank r met (the first rank's first one is named)."""
    rank = next(r for r, lines in enumerate(per_rank) if lines)
    return (f"{where}, rank {rank}: {per_rank[rank][0]}; every rank stopped (train.read_timeout_s): the same "
            "command resumes from the last checkpoint once the file system answers again")


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
        stalled: list[str] = []
        while len(micro) < grad_accum and barren < epoch_draws and not stalled:
            drawn = next(batches)
            seen.extend(drawn[0].pop("damaged", []))
            stalled.extend(str(err) for err in drawn[0].pop("stalled", []))
            if "keys" in drawn[0]:
                micro.append(drawn)
                barren = 0
            else:
                barren += 1
        exhausted = barren >= epoch_draws
        damaged, missing, none_left, stalls = collective.sum(
            [float(sum(err.samples for err in seen)), float(grad_accum - len(micro)), float(exhausted),
             float(len(stalled))])
        if stalls:  # never skipped: the next read would wait on the same file system
            raise StalledSample(stalled_message(f"step {step}", collective.gather(stalled)))
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
