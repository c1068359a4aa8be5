"""The dtype names a setting may use (``compute_dtype``, ``feature_dtype``) and their torch dtypes."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""dtype name -> torch dtype."""

DTYPE_NAMES: tuple[str, ...] = tuple(TORCH_DTYPES)
"""The names a dtype setting accepts."""


def dtype_name(dtype: torch.dtype) -> str:
    """The setting name of a torch dtype (inverse of :data:`TORCH_DTYPES`)."""
    for name, candidate in TORCH_DTYPES.items():
        if candidate == dtype:
            return name
    raise ValueError(f"dtype {dtype} has no name; expected one of {', '.join(DTYPE_NAMES)}")
