"""Optional fused kernels for Qwen2.5-VL's decoder, each a setting, never required.

* **Liger** (``train.liger_kernels``): Liger-Kernel's Triton RMSNorm and SwiGLU MLP for Qwen2.5-VL,
  patched into the model in place (its fused cross-entropy stays off: janus computes token logits
  only at the supervised rows; its M-RoPE too: transformers 5 merges the M-RoPE sections into the
  rotary tables and no longer calls the function Liger replaces). Needs the ``liger-kernel`` package.
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
    """Liger's Qwen2.5-VL RMSNorm and SwiGLU kernels, patched into ``qwen`` in place."""
    missing = liger_missing()
    if missing is not None:
        raise KernelUnavailable(missing)
    _name_liger_imports()
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2_5_vl

    apply_liger_kernel_to_qwen2_5_vl(model=qwen, rope=False, cross_entropy=False, fused_linear_cross_entropy=False)


def _name_liger_imports() -> None:
    """Give transformers' Qwen2.5-VL module the output class name Liger's patch imports.

    liger-kernel (0.8.5, the newest) imports ``Qwen2_5_VLCausalLMOutputWithPast``, which transformers
    renamed ``MultimodalCausalLMOutputWithPast`` before 5.23 (the oldest janus accepts), so its
    Qwen2.5-VL patch fails to import. The class only types Liger's fused-loss forward, which janus
    leaves off; naming it lets the RMSNorm and SwiGLU kernels apply. Must run before Liger's
    modules are first imported (they read the name at import)."""
    from janus_core.bases import QWEN2_5_VL

    modeling = importlib.import_module(QWEN2_5_VL.modeling_module)
    if not hasattr(modeling, "Qwen2_5_VLCausalLMOutputWithPast"):
        from transformers.modeling_outputs import MultimodalCausalLMOutputWithPast

        modeling.Qwen2_5_VLCausalLMOutputWithPast = MultimodalCausalLMOutputWithPast


def compile_decoder_layers(layers: nn.ModuleList, **options: object) -> int:
    """``torch.compile`` each decoder layer in place (regional compilation); returns how many.
    ``options`` go to ``torch.compile`` (e.g. ``backend``)."""
    for layer in layers:
        layer.compile(**options)
    return len(layers)
