"""Which decoder layers recompute their activations in the backward pass (the profile setting
``train.gradient_checkpointing: full | none | every_K``).

Full recomputation costs about one extra LLM forward per step and saves the most memory; every
K-th layer trades part of that memory back for speed, so the measured best can be chosen
(``make bench-gpu`` measures each).

janus sets the decoder layers' flags itself rather than through transformers'
``activation_checkpointing_enable``: that one also calls ``enable_input_require_grads()``, which
hooks the input embedding of every nested pretrained model (for Qwen2.5-VL: the frozen ViT's
``patch_embed``), so all frozen ViT blocks would record a graph, run in the backward and be
recomputed; and its ``every_n_layers`` counts ViT blocks together with decoder layers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the setting is read with a profile, without torch; apply() runs with a model
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

    def checkpointed(self, layers: int) -> list[bool]:
        """Which of ``layers`` decoder layers recompute (layer 0, K, 2K, ...)."""
        return [self.enabled and i % self.every == 0 for i in range(layers)]

    def apply(self, model: nn.Module, layers: Sequence[nn.Module]) -> None:
        """Set it on the decoder ``layers`` of a transformers ``model``; every other module of the
        model (the ViT blocks among them) keeps its activations, and any input-grad hook an earlier
        ``activation_checkpointing_enable`` left on ``model`` is removed."""
        disable_hooks = getattr(model, "disable_input_require_grads", None)
        if disable_hooks is not None:
            disable_hooks()
        for module in model.modules():
            if getattr(module, "gradient_checkpointing", False):
                module.gradient_checkpointing = False
        from torch.utils.checkpoint import checkpoint

        # Non-reentrant: inputs need not require grad, so nothing frozen is pulled into autograd.
        recompute = partial(checkpoint, use_reentrant=False)
        for layer, on in zip(layers, self.checkpointed(len(layers)), strict=True):
            layer._gradient_checkpointing_func = recompute
            layer.gradient_checkpointing = on


FULL = ActivationCheckpointing(1)
NONE = ActivationCheckpointing(0)
