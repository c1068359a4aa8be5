"""Training on several caches at once, each drawn with a sampling weight (e.g. R2R 0.7, RxR 0.3).

A run trains on one global sample sequence per epoch (the trainer deals it to ranks, see
:func:`janus_cache.store.split.rank_share_from`). For a mixture of caches that sequence is:

* **epoch length** ``L`` = the sum of the sources' sizes (the rows each source trains on), so an
  epoch has as many samples as all caches together; with weights proportional to the sizes an
  epoch is exactly one pass over every cache.
* **draws**: source ``i`` contributes ``c_i`` = ``w_i * L`` samples per epoch (largest remainder
  rounding of the normalised weights, so the counts sum to ``L`` and each is within one of its
  share).
* **which samples**: each source has an endless stream of its own passes, pass ``p`` being the
  seeded permutation ``epoch_order(n_i, seed, p, stream=i)``; epoch ``e`` takes the stream's
  items ``[e * c_i, (e + 1) * c_i)``. A source drawn above its size repeats only after a whole
  pass; one drawn below it sees the rest of its pass in the next epoch.
* **interleave**: the epoch's ``L`` source labels (``c_i`` of each) in a seeded random order,
  each label taking the next item of its source's share.

Everything depends only on (seed, epoch, sizes, weights), never on the number of ranks, so a
resume continues the exact sequence at a global position, on any world. One source with any
weight gives exactly the plain epoch permutation of :func:`janus_cache.store.split.epoch_order`.

Sources are named on the command line as ``NAME=PATH:WEIGHT`` (:func:`janus_train.data.sources.parse_cache_sources`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from janus_cache.store import OpenedCache
from janus_cache.store.split import epoch_order, rank_share_from
from janus_train.data.prompt import PromptBuilder
from janus_train.data.samples import CachedSamples, DamagedItem
from janus_train.data.sources import MixtureError

_LABEL_STREAM = 2**20
"""Permutation stream of the interleave (far above any source's stream index)."""


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Non-negative integer counts summing to ``total``, each within one of ``weight / sum * total``
    (the largest fractional parts round up; ties go to the earlier source)."""
    shares = [w / sum(weights) * total for w in weights]
    counts = [math.floor(s) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class Mixture:
    """The global per-epoch sample sequence of several sources of ``sizes`` samples drawn with
    ``weights`` (any positive scale); items are flat indices into the sources' concatenation
    (source ``i``'s row ``r`` is ``sum(sizes[:i]) + r``)."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    seed: int

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.weights):
            raise MixtureError(f"a mixture needs one weight per source, got sizes {self.sizes}, weights {self.weights}")
        if min(self.sizes) < 1 or min(self.weights) <= 0:
            raise MixtureError(f"every source needs samples and a positive weight: sizes {self.sizes}, "
                               f"weights {self.weights}")

    @property
    def epoch_length(self) -> int:
        return sum(self.sizes)

    def draws(self) -> list[int]:
        """Samples each source contributes to every epoch."""
        return largest_remainder(self.weights, self.epoch_length)

    def _stream(self, source: int, start: int, count: int) -> np.ndarray:
        """Items ``[start, start + count)`` of source ``source``'s endless stream of passes."""
        n = self.sizes[source]
        first, last = start // n, (start + count - 1) // n if count else start // n
        passes = [np.asarray(epoch_order(n, self.seed, p, stream=source), dtype=np.int64)
                  for p in range(first, last + 1)]
        offset = start - first * n
        return np.concatenate(passes)[offset : offset + count]

    def epoch_sequence(self, epoch: int) -> list[int]:
        """The epoch's global sequence of flat sample indices (length :attr:`epoch_length`)."""
        draws = self.draws()
        if len(self.sizes) == 1:
            return epoch_order(self.sizes[0], self.seed, epoch)
        labels = np.repeat(np.arange(len(draws)), draws)
        labels = labels[np.asarray(epoch_order(len(labels), self.seed, epoch, stream=_LABEL_STREAM))]
        offsets = np.cumsum((0,) + self.sizes[:-1])
        sequence = np.empty(len(labels), dtype=np.int64)
        for source, count in enumerate(draws):
            sequence[labels == source] = offsets[source] + self._stream(source, epoch * count, count)
        return sequence.tolist()

    def rank_rows(self, epoch: int, rank: int, world: int, start: int = 0, stop: int | None = None) -> list[int]:
        """What rank ``rank`` of ``world`` reads of the epoch: its round-robin share of the epoch's
        sequence from global position ``start`` (the samples all ranks together have consumed) up
        to ``stop`` (:func:`~janus_cache.store.split.rank_share_from`). The trainer's sampler."""
        return rank_share_from(self.epoch_sequence(epoch), rank, world, start, stop)


class MixedSamples(Dataset):
    """Several map-style datasets as one, indexed by flat index (source ``i``'s row ``r`` at
    ``sum(sizes[:i]) + r``); each item's key is prefixed with its source's name (``r2r/<key>``),
    so keys stay unique when two caches share episode names. A damaged sample stays a
    :class:`DamagedItem` (its error names the cache's file, and the sample by its mixture key)."""

    def __init__(self, names: Sequence[str], datasets: Sequence[Dataset]) -> None:
        if len(names) != len(datasets) or not datasets:
            raise MixtureError("MixedSamples needs one name per dataset")
        self.names, self.datasets = list(names), list(datasets)
        self.sizes = tuple(len(d) for d in self.datasets)
        self.offsets = np.cumsum((0,) + self.sizes)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(source, row in that source) of a flat index."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of a mixture of {len(self)}")
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return source, int(index - self.offsets[source])

    def __getitem__(self, index: int) -> Any:
        source, row = self.locate(int(index))
        item = self.datasets[source][row]
        if isinstance(item, DamagedItem):  # its key is the error's: name the sample as the mixture does
            error = item.error
            return DamagedItem(error.for_sample(f"{self.names[source]}/{error.key}")) if error.key else item
        return replace(item, key=f"{self.names[source]}/{item.key}")


def mixed_samples(opened: Sequence[tuple[str, OpenedCache]], builder: PromptBuilder) -> MixedSamples:
    """Several opened caches ((name, cache) pairs) as one dataset; they must be zarr caches holding
    the same kind of sample (:func:`check_same_encoding`)."""
    streamed = [name for name, o in opened if o.streaming]
    if streamed:
        raise MixtureError(f"cache {streamed[0]!r} is a webdataset (streaming) cache: a weighted mixture draws "
                           "samples at random positions, which needs zarr caches")
    check_same_encoding(opened)
    return MixedSamples([name for name, _ in opened], [CachedSamples(o.reader, builder) for _, o in opened])


def check_same_encoding(manifests: Sequence[tuple[str, OpenedCache]]) -> None:
    """Caches mixed in one run must hold the same kind of sample: resolution, window variant,
    encoder fingerprint and feature dtype (``manifests``: (source name, opened cache) pairs)."""
    first_name, first = manifests[0]
    for name, opened in manifests[1:]:
        for what, get in (("resolution", lambda o: o.resolution), ("window variant", lambda o: o.variant),
                          ("encoder_fingerprint", lambda o: o.manifest.encoder_fingerprint),
                          ("feature_dtype", lambda o: o.manifest.feature_dtype)):
            if get(opened) != get(first):
                raise MixtureError(f"cache {name!r} ({opened.layout.root}) differs from {first_name!r} in {what}: "
                                   f"{get(opened)!r} vs {get(first)!r}")
