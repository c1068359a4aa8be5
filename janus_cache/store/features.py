"""Feature dtypes: the logical dtype a feature has in torch, and the dtype it is stored as.

zarr v3 and numpy have no bfloat16, so a bf16 feature is stored as the uint16 array with the
same bits (a view, no rounding) and the logical dtype is recorded next to it. Reading views the
uint16 bits back as ``torch.bfloat16`` without copying. float32 is stored as itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from janus_core import dtypes

if TYPE_CHECKING:  # torch is imported where tensors are made or taken apart, not to read a manifest
    import torch

STORED_DTYPES: dict[str, str] = {"bfloat16": "uint16", "float32": "float32"}
"""Logical feature dtype -> dtype of the stored array."""



def stored_dtype(logical: str) -> np.dtype:
    """numpy dtype that features of logical dtype ``logical`` are stored as."""
    try:
        return np.dtype(STORED_DTYPES[logical])
    except KeyError:
        raise ValueError(f"feature dtype must be one of {sorted(STORED_DTYPES)}, got {logical!r}") from None


def to_stored(features: torch.Tensor | np.ndarray, logical: str) -> np.ndarray:
    """The array to store for ``features`` of logical dtype ``logical`` (bit-exact, never a cast).

    Accepts a torch tensor of the logical dtype (any device) or a numpy array already in the
    stored dtype. Any other dtype is an error: silently casting would change the features.
    """
    import torch

    target = stored_dtype(logical)
    if isinstance(features, torch.Tensor):
        if features.dtype != dtypes.TORCH_DTYPES[logical]:
            raise TypeError(f"features are {features.dtype}, the cache stores {logical} features")
        tensor = features.detach().to("cpu").contiguous()
        if logical == "bfloat16":
            # bf16 and int16 have the same width: the view keeps every bit; numpy reinterprets as uint16.
            return tensor.view(torch.int16).numpy().view(np.uint16)
        return tensor.numpy()
    array = np.asarray(features)
    if array.dtype != target:
        raise TypeError(
            f"features are numpy {array.dtype}, the cache stores {logical} features as {target} "
            f"(pass a torch.{logical} tensor or a {target} array)"
        )
    return np.ascontiguousarray(array)


def from_stored(array: np.ndarray, logical: str) -> torch.Tensor:
    """The torch tensor of logical dtype ``logical`` for a stored array (zero-copy when possible)."""
    import torch

    target = stored_dtype(logical)
    if array.dtype != target:
        raise TypeError(f"stored features are {array.dtype}, expected {target} for {logical}")
    array = np.ascontiguousarray(array)
    if logical == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
