"""Which decoder layers recompute their activations in the backward pass (the profile setting
``train.gradient_checkpointing: full | none | every_K``).

Full recomputation costs about one extra LLM forward per step and saves the most memory; every
K-th layer trades part of that memory back for speed, so the measured best can be chosen
(``make bench-gpu`` measures each).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

_EVERY = re.compile(r"every_([1-9][0-9]*)")


@dataclass(frozen=True)
class ActivationCheckpointing:
    """``every``: 0 = no layer recomputes, 1 = every layer (full), K = every K-th layer."""

    every: int = 1

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"activation checkpointing every {self.every} layers: must be >= 0")

    @classmethod
    def parse(cls, value: object) -> ActivationCheckpointing:
        """``full``, ``none``, ``every_K`` (K >= 1), or a bool (true = full, false = none)."""
        if isinstance(value, bool):
            return cls(1 if value else 0)
        if value == "full":
            return cls(1)
        if value == "none":
            return cls(0)
        match = _EVERY.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"expected full, none or every_K (K >= 1), got {value!r}")
        return cls(int(match.group(1)))

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def __str__(self) -> str:
        return {0: "none", 1: "full"}.get(self.every, f"every_{self.every}")

    def apply(self, model: nn.Module) -> None:
        """Set it on a transformers model (``activation_checkpointing_enable``/``_disable``)."""
        if self.enabled:
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=self.every
            )
        else:
            model.activation_checkpointing_disable()


FULL = ActivationCheckpointing(1)
NONE = ActivationCheckpointing(0)
