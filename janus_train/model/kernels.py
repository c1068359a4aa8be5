"""Optional fused kernels for Qwen2.5-VL's decoder, each a setting, never required.

* **Liger** (``train.liger_kernels``): Liger-Kernel's Triton RMSNorm, SwiGLU MLP and RoPE for
  Qwen2.5-VL, patched into the model in place (its fused cross-entropy stays off: janus computes
  token logits only at the supervised rows). Needs the ``liger-kernel`` package.
* **Regional compile** (``train.compile_layers``): ``torch.compile`` of each decoder layer on its
  own, so one compiled graph is reused by every layer (compile time of one layer, not of the model)
  and the elementwise work between the matmuls is fused.

``make bench-gpu`` measures each as a row of its own.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # liger_missing() is asked when a profile is read, without torch
    from torch import nn

LIGER_PACKAGE = "liger_kernel"


class KernelUnavailable(RuntimeError):
    """A kernel setting asks for a library this environment does not have; the message says which."""


def liger_missing() -> str | None:
    """Why Liger's kernels cannot be applied here, or ``None`` when they can."""
    if importlib.util.find_spec(LIGER_PACKAGE) is None:
        return "the liger-kernel package is not installed (pip install liger-kernel)"
    return None


def apply_liger(qwen: nn.Module) -> None:
    """Liger's Qwen2.5-VL RMSNorm, SwiGLU and RoPE kernels, patched into ``qwen`` in place."""
    missing = liger_missing()
    if missing is not None:
        raise KernelUnavailable(missing)
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2_5_vl

    apply_liger_kernel_to_qwen2_5_vl(model=qwen, cross_entropy=False, fused_linear_cross_entropy=False)


def compile_decoder_layers(layers: nn.ModuleList, **options: object) -> int:
    """``torch.compile`` each decoder layer in place (regional compilation); returns how many.
    ``options`` go to ``torch.compile`` (e.g. ``backend``)."""
    for layer in layers:
        layer.compile(**options)
    return len(layers)
