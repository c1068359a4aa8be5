"""Configuration and fixed constants of the VGGT aggregator.

The field names are the constructor keyword arguments of :class:`VGGTAggregator` and the keys of
the ``aggregator`` section of a VGGT ``config.json``; the defaults are VGGT-1B.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

# Re-exported: the window variant's choices are declared in the torch-free janus_core.windows.
from janus_core.windows import ATTENTION_MODES, REFERENCE_FRAMES, AttentionMode, ReferenceFrame  # noqa: F401

# Eps values differ between the two halves of the model (DINOv2 uses 1e-6, the aggregator blocks
# and their qk-norm keep PyTorch's default 1e-5); checkpoints were trained with exactly these.
PATCH_EMBED_LAYERNORM_EPS = 1e-6
AGGREGATOR_LAYERNORM_EPS = 1e-5
QK_NORM_LAYERNORM_EPS = 1e-5

# LayerScale initial values (only matter for randomly initialised models).
PATCH_EMBED_LAYERSCALE_INIT = 1.0
AGGREGATOR_LAYERSCALE_INIT = 0.01

# ImageNet statistics the aggregator normalises its [0, 1] input with.
RESNET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
RESNET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PatchEmbedConfig:
    """The DINOv2 ViT (with registers) that turns each frame into patch tokens."""

    embed_dim: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4


@dataclass(frozen=True)
class AggregatorConfig:
    """Sizes and options of the aggregator (alternating frame/global attention)."""

    img_size: int = 518
    patch_size: int = 14
    embed_dim: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4
    qkv_bias: bool = True
    proj_bias: bool = True
    ffn_bias: bool = True
    qk_norm: bool = True
    rope_freq: float = 100.0
    attention: AttentionMode = "causal"
    patch_embed: PatchEmbedConfig = field(default_factory=PatchEmbedConfig)

    def __post_init__(self) -> None:
        if isinstance(self.patch_embed, Mapping):
            object.__setattr__(self, "patch_embed", _build(PatchEmbedConfig, self.patch_embed, "patch_embed"))
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {self.attention!r}")
        if self.patch_embed.embed_dim != self.embed_dim:
            # Patch tokens are concatenated with the camera/register tokens, so widths must agree.
            raise ValueError(
                f"patch_embed.embed_dim ({self.patch_embed.embed_dim}) must equal embed_dim ({self.embed_dim})"
            )
        for name, dim, heads in (
            ("", self.embed_dim, self.num_heads),
            ("patch_embed.", self.patch_embed.embed_dim, self.patch_embed.num_heads),
        ):
            if dim % heads:
                raise ValueError(f"{name}embed_dim ({dim}) is not divisible by {name}num_heads ({heads})")
        if (self.embed_dim // self.num_heads) % 4:
            # 2-D RoPE splits the head dim into a row half and a column half of rotated pairs.
            raise ValueError(f"head dim {self.embed_dim // self.num_heads} must be a multiple of 4 for 2-D RoPE")
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size ({self.img_size}) is not a multiple of patch_size ({self.patch_size})")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def patch_start_idx(self) -> int:
        """Index of the first patch token in a frame: camera token, then the registers."""
        return 1 + self.num_register_tokens

    def tokens_per_frame(self, height: int, width: int) -> int:
        return self.patch_start_idx + (height // self.patch_size) * (width // self.patch_size)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "AggregatorConfig":
        """Build from a dict such as the ``aggregator`` section of a ``config.json``."""
        return _build(cls, values, "aggregator config")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build(cls: type, values: Mapping[str, Any], what: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}; expected a subset of {sorted(known)}")
    return cls(**dict(values))
