"""How every benchmark reports a figure (a median over repeats with its min and max) and where."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where every benchmark writes its results and plots by default (README.md there says what each is)."""


@dataclass(frozen=True)
class Stat:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        return f"{self.median:.3g} ({self.min:.3g}–{self.max:.3g})"


def rates(fn: Callable[[], int], repeats: int) -> Stat:
    """Items per second of ``fn`` (which returns how many items it did), after one warm-up call."""
    fn()
    values = []
    for _ in range(repeats):
        start = time.perf_counter()
        n = fn()
        values.append(n / (time.perf_counter() - start))
    return Stat.of(values)
