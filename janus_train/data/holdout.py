"""Which sample rows validate and which train: episodes of the training data held out whole.

Held out by episode, never by sample: the samples of one episode share frames, instruction and
most of their answer, so a sample-level split would validate on near-copies of training samples.
The choice depends only on the episode ids (in their row order) and the seed, so every rank and
every resume picks the same episodes, and no episode is in both sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from janus_core.plural import plural

_HOLDOUT_SEED_OFFSET = 7_919
"""Keeps the hold-out's generator apart from the epoch permutations of the same seed (a prime)."""


class HoldoutError(ValueError):
    """The hold-out asked for cannot be made (e.g. it would leave no episode to train on)."""


@dataclass(frozen=True)
class Holdout:
    """Rows of the training data split by episode: ``train_rows`` and ``val_rows`` (ascending, disjoint,
    together every row) and the held-out episode ids (in row order)."""

    train_rows: tuple[int, ...]
    val_rows: tuple[int, ...]
    val_episodes: tuple[str, ...]


def heldout_count(n_episodes: int, episodes: int = 0, fraction: float = 0.0) -> int:
    """Episodes to hold out: ``episodes``, or ``fraction`` of ``n_episodes`` rounded (at least 1
    when the fraction is positive); at least one episode must be left to train on."""
    count = episodes if episodes else (max(1, round(fraction * n_episodes)) if fraction > 0 else 0)
    if count >= n_episodes:
        raise HoldoutError(f"holding out {count} of {plural(n_episodes, 'episode')} for validation leaves none to train on")
    return count


def split_by_episode(episode_of_row: Sequence[str], count: int, seed: int) -> Holdout:
    """Hold out ``count`` episodes, a seeded random choice among the episodes of ``episode_of_row``
    (the episode id of each sample row)."""
    episodes = list(dict.fromkeys(episode_of_row))  # first-appearance (row) order
    if not 0 <= count < len(episodes):
        raise HoldoutError(f"cannot hold out {count} of {plural(len(episodes), 'episode')} and keep one to train on")
    generator = torch.Generator().manual_seed(seed + _HOLDOUT_SEED_OFFSET)
    chosen = set(torch.randperm(len(episodes), generator=generator)[:count].tolist())
    held = {episodes[i] for i in chosen}
    val_rows = tuple(row for row, episode in enumerate(episode_of_row) if episode in held)
    train_rows = tuple(row for row, episode in enumerate(episode_of_row) if episode not in held)
    return Holdout(train_rows, val_rows, tuple(e for e in episodes if e in held))
