"""Reference JanusVLN checkpoint directories at the tiny sizes, written as the reference trainer
lays them out, and damaged copies of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

from helpers.model_cases import QWEN_DIR, VGGT_CONFIG
from janus_core.vggt import AggregatorConfig, VGGTAggregator

LAM = 0.35  # not the profile's 0.2: the checkpoint's value must win


MERGER_HIDDEN = 48  # not the profile's 128


HIDDEN = 64  # the tiny Qwen's hidden size


FEATURE_DIM = 128  # 2 x the tiny VGGT's embed_dim


RESOLUTION = "pad56"  # the resolution of model_cases' batches


def reference_names_of_qwen() -> list[str]:
    """The 4.50 state-dict names of the tiny Qwen: transformers 5 nests the LLM under
    ``model.language_model`` and the ViT under ``model.visual``; 4.50 keeps them at ``model``/``visual``."""
    config = AutoConfig.from_pretrained(QWEN_DIR)
    with torch.device("meta"):
        names = list(Qwen2_5_VLForConditionalGeneration._from_config(config).state_dict())
    renamed = []
    for name in names:
        if name.startswith("model.language_model."):
            name = "model." + name.removeprefix("model.language_model.")
        elif name.startswith("model.visual."):
            name = "visual." + name.removeprefix("model.visual.")
        renamed.append(name)
    return renamed


def reference_shapes() -> dict[str, tuple[int, ...]]:
    config = AutoConfig.from_pretrained(QWEN_DIR)
    with torch.device("meta"):
        qwen = Qwen2_5_VLForConditionalGeneration._from_config(config).state_dict()
        vggt = VGGTAggregator.from_config(AggregatorConfig.from_dict(json.loads(VGGT_CONFIG.read_text()))).state_dict()
    shapes = dict(zip(reference_names_of_qwen(), (tuple(t.shape) for t in qwen.values())))
    shapes.update({
        "merger.ln_q.weight": (FEATURE_DIM,),
        "merger.mlp.0.weight": (MERGER_HIDDEN, 4 * FEATURE_DIM), "merger.mlp.0.bias": (MERGER_HIDDEN,),
        "merger.mlp.2.weight": (HIDDEN, MERGER_HIDDEN), "merger.mlp.2.bias": (HIDDEN,),
        "action_head.0.weight": (512, HIDDEN), "action_head.0.bias": (512,),
        "action_head.1.weight": (512,), "action_head.1.bias": (512,),
        "action_head.3.weight": (4, 512), "action_head.3.bias": (4,),
    })
    shapes.update({f"vggt.aggregator.{k}": tuple(v.shape) for k, v in vggt.items()})
    return shapes


def dpt_head_shapes(prefix: str, output_dim: int) -> dict[str, tuple[int, ...]]:
    """The state dict of VGGT's ``DPTHead`` (facebookresearch/vggt, vggt/heads/dpt_head.py) at toy
    widths: its names exactly, 62 tensors (VGGT-1B: dim_in 2048, features 256, out_channels
    256/512/1024/1024; here the tiny feature width 128, features 8, out_channels 4/8/16/16)."""
    dim_in, features, out_channels, head_features_2 = FEATURE_DIM, 8, (4, 8, 16, 16), 32
    shapes: dict[str, tuple[int, ...]] = {"norm.weight": (dim_in,), "norm.bias": (dim_in,)}
    for i, channels in enumerate(out_channels):  # 1x1 convolutions from the tokens
        shapes |= {f"projects.{i}.weight": (channels, dim_in, 1, 1), f"projects.{i}.bias": (channels,)}
    # ConvTranspose2d x4, ConvTranspose2d x2, Identity (no tensors), Conv2d stride 2
    for i, kernel in ((0, 4), (1, 2), (3, 3)):
        channels = out_channels[i]
        shapes |= {f"resize_layers.{i}.weight": (channels, channels, kernel, kernel),
                   f"resize_layers.{i}.bias": (channels,)}
    for i, channels in enumerate(out_channels, start=1):  # bias=False
        shapes[f"scratch.layer{i}_rn.weight"] = (features, channels, 3, 3)
    for i in range(1, 5):  # FeatureFusionBlock; refinenet4 has no residual unit 1
        block = f"scratch.refinenet{i}."
        shapes |= {block + "out_conv.weight": (features, features, 1, 1), block + "out_conv.bias": (features,)}
        for unit in ("resConfUnit1", "resConfUnit2") if i < 4 else ("resConfUnit2",):
            for conv in ("conv1", "conv2"):
                shapes |= {f"{block}{unit}.{conv}.weight": (features, features, 3, 3),
                           f"{block}{unit}.{conv}.bias": (features,)}
    shapes |= {
        "scratch.output_conv1.weight": (features // 2, features, 3, 3), "scratch.output_conv1.bias": (features // 2,),
        "scratch.output_conv2.0.weight": (head_features_2, features // 2, 3, 3),
        "scratch.output_conv2.0.bias": (head_features_2,),
        "scratch.output_conv2.2.weight": (output_dim, head_features_2, 1, 1),
        "scratch.output_conv2.2.bias": (output_dim,),
    }
    return {prefix + name: shape for name, shape in shapes.items()}


def vggt_head_shapes() -> dict[str, tuple[int, ...]]:
    """The VGGT depth (2 outputs) and point (4 outputs) heads every reference checkpoint keeps."""
    return dpt_head_shapes("vggt.depth_head.", 2) | dpt_head_shapes("vggt.point_head.", 4)


def reference_config(reference_frame: str = "last") -> dict[str, Any]:
    """The tiny Qwen config flattened as transformers 4.50 writes it, plus the JanusVLN fields."""
    tiny = json.loads((QWEN_DIR / "config.json").read_text())
    text = {k: v for k, v in tiny.pop("text_config").items() if k not in ("model_type", "dtype")}
    rope = text.pop("rope_parameters")
    vision = {k: v for k, v in tiny.pop("vision_config").items() if k not in ("model_type", "dtype")}
    tiny.pop("dtype")
    return {
        **tiny, **text,
        "architectures": ["Qwen2_5_VLForConditionalGenerationForJanusVLN"],
        "rope_theta": rope["rope_theta"],
        "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]},
        "vision_config": vision,
        "torch_dtype": "float32",
        "transformers_version": "4.50.0",
        "lam": LAM, "reference_frame": reference_frame, "vggt_merger_hidden_dim": MERGER_HIDDEN,
        "distill_loss_weight": 1.0, "distill_loss_weight_end": None, "distill_loss_weight_warmup_steps": None,
    }


def write_reference_dir(path: Path, state: dict[str, torch.Tensor] | None = None,
                        config: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if state is None:
        generator = torch.Generator().manual_seed(1)
        state = {key: 0.05 * torch.randn(shape, generator=generator) for key, shape in reference_shapes().items()}
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config if config is not None else reference_config(), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json"):
        shutil.copy2(QWEN_DIR / name, path / name)
    return path


def damaged(reference_dir: Path, tmp_path: Path, drop: str | None = None, add: str | None = None) -> Path:
    """A copy of ``reference_dir`` under ``tmp_path`` with the key ``drop`` left out or ``add`` added."""
    from safetensors.torch import load_file

    state = load_file(reference_dir / "model.safetensors")
    if drop is not None:
        del state[drop]
    if add is not None:
        state[add] = torch.zeros(3)
    return write_reference_dir(tmp_path / "damaged", state)
