"""The sample record that crosses store -> reader -> model: one typed value for both formats.

Both readers (:class:`janus_cache.store.zarr_store.ZarrCacheReader`, random access, and
:class:`janus_cache.store.wds_store.WdsCacheReader`, streaming) yield :class:`CacheSample`.
Its ``meta`` is the sample's row of the samples table (minus the key), typed: the texts and the
action every sample has, the window's frame rows, and any further columns as they were stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from janus_cache.store.commit import StoreError
from janus_cache.store.layout import KEY_COLUMN, WINDOW_ROWS_COLUMN

if TYPE_CHECKING:  # the readers make the tensors; the record's type needs no torch
    import torch

TEXT_COLUMNS = ("instruction", "subinstruction", "description_2d", "description_3d")
"""Text columns of the samples table that every sample's prompt is built from."""
ACTION_COLUMN = "action"
EPISODE_COLUMN = "episode_id"
SOURCE_COLUMN = "source"
"""The samples table's dataset source name (``janus_core.index.sources``)."""
"""The samples table's column of each sample's episode (what a validation hold-out splits by)."""


@dataclass(frozen=True)
class SampleMeta:
    """A sample's row of the samples table: texts, action id, window frame rows, other columns."""

    instruction: str
    subinstruction: str
    description_2d: str
    description_3d: str
    action: int
    window_rows: tuple[int, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Every other stored column (e.g. ``episode_id``, ``step``), as plain Python values."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any], where: str) -> SampleMeta:
        """The meta of a table row (plain values, without the key); ``where`` names the sample in errors."""
        required = (*TEXT_COLUMNS, ACTION_COLUMN, WINDOW_ROWS_COLUMN)
        missing = [name for name in required if name not in row]
        if missing:
            raise StoreError(f"{where} lacks the sample column(s) {missing}")
        texts = {name: row[name] for name in TEXT_COLUMNS}
        bad = [name for name, value in texts.items() if not isinstance(value, str)]
        if bad:
            raise StoreError(f"{where}: column(s) {bad} must be text")
        return cls(
            **texts,
            action=int(row[ACTION_COLUMN]),
            window_rows=tuple(int(r) for r in row[WINDOW_ROWS_COLUMN]),
            extra={k: v for k, v in row.items() if k not in required and k != KEY_COLUMN},
        )

    def to_row(self) -> dict[str, Any]:
        """The table row again (what the webdataset tars store as the sample's ``meta``)."""
        return {
            **{name: getattr(self, name) for name in TEXT_COLUMNS},
            ACTION_COLUMN: self.action,
            WINDOW_ROWS_COLUMN: list(self.window_rows),
            **self.extra,
        }


@dataclass(frozen=True)
class CacheSample:
    """One cached sample: its key and sample row, the window's uint8 frames ``[S, H, W, 3]``
    (S = history + 1), the stored feature ``[N, 2C]`` in its logical dtype, its meta and, from a
    cache opened with ``vit_features=True``, the window frames' cached ViT output ``[S, T, D]``
    (a DeepStack base, Qwen3-VL: ``[S, levels, T, D]``)."""

    key: str
    row: int
    frames: np.ndarray
    feature: torch.Tensor
    meta: SampleMeta
    vit_features: torch.Tensor | None = None
