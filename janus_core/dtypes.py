"""The dtype names a setting may use (``compute_dtype``, ``feature_dtype``) and their torch dtypes."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16")
"""The names a dtype setting accepts (torch-free: reading a profile imports no torch)."""


@cache
def _torch_dtypes() -> dict[str, torch.dtype]:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}


def __getattr__(name: str) -> Any:
    # TORCH_DTYPES (dtype name -> torch dtype) is made on first use, when torch is imported anyway.
    if name == "TORCH_DTYPES":
        return _torch_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """The setting name of a torch dtype (inverse of ``TORCH_DTYPES``)."""
    TORCH_DTYPES = _torch_dtypes()
    for name, candidate in TORCH_DTYPES.items():
        if candidate == dtype:
            return name
    raise ValueError(f"dtype {dtype} has no name; expected one of {', '.join(DTYPE_NAMES)}")
