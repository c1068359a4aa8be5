"""The M-RoPE position ids of a micro-batch, from the model's config alone, by the base's own rule.

Qwen's ``get_rope_index`` walks every sequence in Python (70-120 ms per 5k-token sample on a CPU
core). Run in the training process's forward, that sits on the GPU's critical path; a loader
worker builds them with the batch instead (:func:`janus_train.data.samples.collate`), and the model only
computes them for a batch that comes without (one built by hand). Both call the base's own code
(``Qwen2_5_VLModel.get_rope_index`` or ``Qwen3VLModel.get_rope_index``, picked by the config's
``model_type``, :mod:`janus_core.bases`), so the ids are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from janus_core.bases import base_of_config


def _config_only(config: PretrainedConfig) -> object:
    """What the base's ``get_rope_index`` reads of its model: the config and one helper that reads
    nothing (so a loader worker needs no model)."""
    inner = base_of_config(config).transformers_class("inner")
    holder = type("_ConfigOnly", (), {"get_rope_index": inner.get_rope_index,
                                      "get_vision_position_ids": inner.get_vision_position_ids})()
    holder.config = config
    return holder


@dataclass(frozen=True)
class RopeIndex:
    """M-RoPE position ids for a model of ``config`` (picklable: it travels to loader workers)."""

    config: PretrainedConfig

    @classmethod
    def from_dir(cls, qwen_dir: Path | str) -> RopeIndex:
        """From the ``config.json`` of a Qwen directory (no weights read)."""
        return cls(AutoConfig.from_pretrained(Path(qwen_dir), local_files_only=True))

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """The ViT patch grid of a ``height x width`` frame under this config's base."""
        return base_of_config(self.config).patch_grid(height, width)

    def __call__(self, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                 grid: tuple[int, int], images: int) -> torch.Tensor:
        """Position ids [3, B, L] (int64, CPU) of a right-padded micro-batch whose samples each hold
        ``images`` images of a ``grid`` of patches (padding: 0, as Qwen's code leaves it)."""
        grid_thw = torch.tensor([[1, *grid]], dtype=torch.int64).expand(input_ids.shape[0] * images, 3)
        position_ids, _ = _config_only(self.config).get_rope_index(
            input_ids.cpu(), mm_token_type_ids.cpu(), image_grid_thw=grid_thw, attention_mask=attention_mask.cpu())
        return position_ids
