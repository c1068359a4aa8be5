"""The frozen VGGT aggregator (JanusVLN's block-causal variant), checkpoint-compatible with VGGT-1B.

Each frame becomes ``[camera | registers | DINOv2 patch tokens]``; then ``depth`` pairs of blocks
alternate attention within each frame and across the frames of a window. Global attention is
block-causal over frames by default (frame t sees frames <= t), which is what JanusVLN runs and
what makes one-pass and frame-by-frame streaming agree; ``attention="full"`` is upstream VGGT.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from janus_core.vggt.attention import AttentionKernel, KernelChoice, candidate, kernel_for
from janus_core.vggt.config import (
    AGGREGATOR_LAYERNORM_EPS,
    AGGREGATOR_LAYERSCALE_INIT,
    QK_NORM_LAYERNORM_EPS,
    REFERENCE_FRAMES,
    RESNET_MEAN,
    RESNET_STD,
    AggregatorConfig,
    AttentionMode,
    PatchEmbedConfig,
    ReferenceFrame,
)
from janus_core.vggt.dino import DinoVisionTransformer
from janus_core.vggt.layers import AttendFn, Block, RopeTables
from janus_core.vggt.rope import grid_positions, rope_tables

# The GPU encode path runs under autocast in this dtype (LayerNorm and softmax stay float32),
# as JanusVLN does; CPU runs in float32.
CUDA_AUTOCAST_DTYPE = torch.bfloat16


@dataclass
class KVCache:
    """Keys and values of every global block for the frames streamed so far.

    ``keys[i]``/``values[i]`` are [batch, heads, frames*tokens_per_frame, head_dim], with keys
    already normalised and rotated (positions are identical in every frame, so this equals
    re-normalising and re-rotating raw keys at each step).
    """

    keys: list[Tensor | None]
    values: list[Tensor | None]
    num_frames: int = 0
    batch_size: int | None = None
    tokens_per_frame: int | None = None

    @classmethod
    def empty(cls, depth: int) -> "KVCache":
        return cls(keys=[None] * depth, values=[None] * depth)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


@dataclass(frozen=True)
class _Run:
    """What the global attention of one pass over new frames needs to know."""

    tokens_per_frame: int
    rope: RopeTables = field(repr=False)
    attend: AttendFn = field(repr=False)
    cache: KVCache | None = None
    cached_frames: int = 0


class VGGTAggregator(nn.Module):
    """VGGT aggregator: DINOv2 patch embed + alternating frame/global attention, frozen.

    Constructor keyword arguments are the ``aggregator`` section of a VGGT ``config.json``
    (defaults: VGGT-1B); ``patch_embed`` is a dict (or :class:`PatchEmbedConfig`) with the DINOv2
    sizes. The module is frozen by construction (no gradients, always in eval mode).
    """

    def __init__(
        self,
        *,
        img_size: int = 518,
        patch_size: int = 14,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_register_tokens: int = 4,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        ffn_bias: bool = True,
        qk_norm: bool = True,
        rope_freq: float = 100.0,
        attention: AttentionMode = "causal",
        patch_embed: Mapping[str, Any] | PatchEmbedConfig | None = None,
    ) -> None:
        super().__init__()
        self.config = AggregatorConfig(
            img_size=img_size,
            patch_size=patch_size,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            num_register_tokens=num_register_tokens,
            qkv_bias=qkv_bias,
            proj_bias=proj_bias,
            ffn_bias=ffn_bias,
            qk_norm=qk_norm,
            rope_freq=rope_freq,
            attention=attention,
            patch_embed=PatchEmbedConfig() if patch_embed is None else patch_embed,
        )
        cfg = self.config
        # Slot 0 is for the first frame of a sequence, slot 1 for every later frame.
        self.camera_token = nn.Parameter(torch.zeros(1, 2, 1, embed_dim))
        self.register_token = nn.Parameter(torch.zeros(1, 2, num_register_tokens, embed_dim))
        self.patch_embed = DinoVisionTransformer(cfg.patch_embed, img_size, patch_size)
        block = functools.partial(
            Block,
            embed_dim,
            num_heads,
            mlp_ratio,
            qkv_bias=qkv_bias,
            proj_bias=proj_bias,
            ffn_bias=ffn_bias,
            qk_norm=qk_norm,
            norm_eps=AGGREGATOR_LAYERNORM_EPS,
            qk_norm_eps=QK_NORM_LAYERNORM_EPS,
            layerscale_init=AGGREGATOR_LAYERSCALE_INIT,
        )
        self.frame_blocks = nn.ModuleList(block() for _ in range(depth))
        self.global_blocks = nn.ModuleList(block() for _ in range(depth))
        self.register_normalisation_buffers()
        self._init_weights()
        self.requires_grad_(False)
        self.eval()
        self._forced_kernel: AttentionKernel | None = None

    # ------------------------------------------------------------------ construction / loading

    @classmethod
    def from_config(cls, config: AggregatorConfig | Mapping[str, Any]) -> "VGGTAggregator":
        cfg = config if isinstance(config, AggregatorConfig) else AggregatorConfig.from_dict(config)
        return cls(**cfg.to_dict())

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        config: AggregatorConfig | Mapping[str, Any] | None = None,
        device: str | torch.device = "cpu",
    ) -> "VGGTAggregator":
        """Load a VGGT checkpoint from a local directory or file; never downloads.

        ``path`` is a directory holding ``model.safetensors`` (preferred), ``model.pt``,
        ``model.pth`` or a sharded ``model.safetensors.index.json``, or one such file. Keys may
        be those of a reference JanusVLN checkpoint (``vggt.aggregator.*``; its Qwen weights,
        merger and action head are ignored), full-model keys (``aggregator.*``; other heads such as
        ``depth_head.*`` are ignored) or bare aggregator keys. Loading is strict:
        a missing or unexpected aggregator key, or a shape mismatch, raises
        :class:`~janus_core.vggt.checkpoint.CheckpointError` naming the key.

        The architecture comes from ``config`` (constructor kwargs) when given; otherwise from the
        ``aggregator`` section of a ``config.json`` next to the weights; otherwise the VGGT-1B
        defaults. Weights are converted to float32.
        """
        from janus_core.vggt import checkpoint

        weights = checkpoint.resolve_weights_file(path)
        cfg = checkpoint.resolve_config(weights, config)
        with torch.device("meta"):
            model = cls.from_config(cfg)
        state = checkpoint.load_aggregator_state_dict(weights, device=device)
        checkpoint.check_state_dict(model.state_dict(), state, source=weights)
        # assign=True adopts the loaded tensors instead of copying into freshly initialised ones,
        # so the 0.9 B-parameter model is never materialised twice.
        model.load_state_dict(state, strict=True, assign=True)
        model.register_normalisation_buffers(device=torch.device(device))
        model.to(dtype=torch.float32)
        model.requires_grad_(False)
        return model.eval()

    def register_normalisation_buffers(self, device: torch.device | None = None) -> None:
        """(Re)create the ImageNet mean/std buffers; non-persistent, so not in the state dict."""
        shape = (1, 1, 3, 1, 1)
        self.register_buffer("_resnet_mean", torch.tensor(RESNET_MEAN, device=device).view(shape), persistent=False)
        self.register_buffer("_resnet_std", torch.tensor(RESNET_STD, device=device).view(shape), persistent=False)

    @torch.no_grad()
    def _init_weights(self) -> None:
        """Random initialisation for models that are not loaded from a checkpoint (tests, benchmarks)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.camera_token, std=1e-6)
        nn.init.normal_(self.register_token, std=1e-6)
        nn.init.normal_(self.patch_embed.cls_token, std=1e-6)
        nn.init.normal_(self.patch_embed.register_tokens, std=1e-6)
        nn.init.trunc_normal_(self.patch_embed.pos_embed, std=0.02)

    def train(self, mode: bool = True) -> "VGGTAggregator":
        """Frozen encoder: stays in eval mode whatever a parent module asks for."""
        return super().train(False)

    # ------------------------------------------------------------------------------ public API

    def normalize(self, images: Tensor) -> Tensor:
        """[..., 3, H, W] in [0, 1] -> ImageNet-normalised."""
        return (images - self._resnet_mean.view(3, 1, 1)) / self._resnet_std.view(3, 1, 1)

    def attention_kernel(self, device: torch.device) -> KernelChoice:
        """The attention kernel every block runs on ``device``: chosen once per device
        (:mod:`janus_core.vggt.attention`) unless :meth:`use_attention_kernel` forced one."""
        if self._forced_kernel is not None:
            return KernelChoice(self._forced_kernel)
        dtype = CUDA_AUTOCAST_DTYPE if device.type == "cuda" else torch.float32
        head_dims = (self.config.head_dim, self.config.patch_embed.embed_dim // self.config.patch_embed.num_heads)
        return kernel_for(device, dtype, tuple(sorted(set(head_dims))))

    def use_attention_kernel(self, name: str | None) -> None:
        """Force the attention kernel ``name`` (see ``attention.CUDA_ORDER``; None: the automatic
        choice again), e.g. to measure each one."""
        if name is None:
            self._forced_kernel = None
            return
        kernel = candidate(name)
        if kernel is None:
            raise ValueError(f"attention kernel {name!r} is not installed")
        self._forced_kernel = kernel

    def fuse(self, enabled: bool = True) -> None:
        """Compile every block's elementwise work around its matmuls and attention (``vggt.compile``);
        ``enabled=False`` returns to the eager blocks."""
        for block in (*self.patch_embed.blocks, *self.frame_blocks, *self.global_blocks):
            block.fuse(enabled)

    @property
    def fused(self) -> bool:
        return all(block.fused for block in (*self.patch_embed.blocks, *self.frame_blocks, *self.global_blocks))

    def resolve_layer(self, layer: int) -> int:
        """Python-style index into the block pairs (``-2`` = second to last) -> 0-based index."""
        depth = self.config.depth
        if not -depth <= layer < depth:
            raise IndexError(f"layer {layer} is out of range for an aggregator with {depth} block pairs")
        return layer % depth

    def forward(self, images: Tensor, *, last_layer: int = -1) -> list[Tensor]:
        """One pass over windows ``images`` [B, S, 3, H, W] (values in [0, 1], frames in order).

        Returns the outputs ``concat(frame_block_out, global_block_out)`` [B, S, P, 2C] of block
        pairs ``0 … last_layer``; later block pairs are not computed. Frame 0 of every window
        uses the first-frame camera/register slot.
        """
        with torch.no_grad(), self._precision(images.device):
            return self._encode(images, self.resolve_layer(last_layer), keep_all=True)

    def window_features(
        self,
        images: Tensor,
        reference_frame: ReferenceFrame = "first",
        layer: int = -2,
        frame_index: Tensor | None = None,
    ) -> Tensor:
        """Patch-token features [B, N, 2C] of each window's reference frame at block pair ``layer``.

        ``"first"`` keeps chronological order and returns the last (current) frame, conditioned on
        its history; ``"last"`` reverses the window first and returns the last processed frame
        (the oldest one, conditioned on all newer ones). Block pairs after ``layer`` are skipped.
        Runs under ``torch.inference_mode``; the result is an ordinary tensor, usable as input to
        trainable modules.

        With ``frame_index`` [B, S] (integers), ``images`` are distinct frames [U, 3, H, W] and
        window b is ``images[frame_index[b]]``: each distinct frame goes through the DINOv2 patch
        embedding once (it sees no other frame, so this is exact), then the windows are gathered.
        """
        if reference_frame not in REFERENCE_FRAMES:
            raise ValueError(f"reference_frame must be one of {REFERENCE_FRAMES}, got {reference_frame!r}")
        layer_index = self.resolve_layer(layer)
        with torch.inference_mode(), self._precision(images.device):
            if reference_frame == "last":
                if frame_index is None:
                    images = images.flip(1)
                else:
                    frame_index = frame_index.flip(1)
            (out,) = self._encode(images, layer_index, keep_all=False, frame_index=frame_index)
            features = out[:, -1, self.config.patch_start_idx :]
        # Inference tensors cannot be saved for backward; a clone outside inference mode can.
        return features.clone()

    def new_cache(self) -> KVCache:
        """An empty KV cache for :meth:`stream_step`."""
        return KVCache.empty(self.config.depth)

    def stream_step(self, frames: Tensor, cache: KVCache, *, last_layer: int = -1) -> list[Tensor]:
        """Process the next frames [B, S, 3, H, W] (usually S = 1) of a stream, updating ``cache``.

        Equal to the matching frames of a one-pass block-causal forward over the whole stream.
        Returns per-layer outputs [B, S, P, 2C] for block pairs ``0 … last_layer``; a cache filled
        with a smaller ``last_layer`` cannot later serve deeper layers.
        """
        if self.config.attention != "causal":
            raise ValueError("streaming needs attention='causal': with 'full' attention earlier frames would see later ones")
        with torch.no_grad(), self._precision(frames.device):
            return self._encode(frames, self.resolve_layer(last_layer), keep_all=True, cache=cache)

    # ---------------------------------------------------------------------------- computation

    def _precision(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=CUDA_AUTOCAST_DTYPE)
        if device.type == "cpu":
            return torch.autocast("cpu", enabled=False)
        return contextlib.nullcontext()

    def _check_images(self, images: Tensor, frame_index: Tensor | None = None) -> None:
        p = self.config.patch_size
        if frame_index is not None:
            if images.dim() != 4 or images.shape[1] != 3:
                raise ValueError(f"expected distinct frames [U, 3, H, W], got shape {tuple(images.shape)}")
            if frame_index.dim() != 2 or frame_index.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"expected an integer frame_index [B, S], got {frame_index.dtype} {tuple(frame_index.shape)}")
        elif images.dim() != 5 or images.shape[2] != 3:
            raise ValueError(f"expected images [B, S, 3, H, W], got shape {tuple(images.shape)}")
        if images.shape[-2] % p or images.shape[-1] % p:
            raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of the patch size {p}")
        if not images.is_floating_point():
            raise ValueError(f"expected float images in [0, 1], got dtype {images.dtype}")

    def _special_tokens(self, batch: int, frames: int, starts_sequence: bool) -> Tensor:
        """Camera + register tokens [batch*frames, 1+R, C] with the slot rule applied."""
        tokens = torch.cat((self.camera_token, self.register_token), dim=2)  # [1, 2, 1+R, C]
        slots = [0] + [1] * (frames - 1) if starts_sequence else [1] * frames
        return tokens[:, slots].expand(batch, -1, -1, -1).reshape(batch * frames, *tokens.shape[2:])

    def _rope(self, rows: int, cols: int, device: torch.device) -> RopeTables:
        positions = grid_positions(rows, cols, self.config.patch_start_idx, device=device)
        return rope_tables(positions, self.config.head_dim, self.config.rope_freq)

    def _encode(
        self, images: Tensor, last: int, keep_all: bool, cache: KVCache | None = None, frame_index: Tensor | None = None
    ) -> list[Tensor]:
        self._check_images(images, frame_index)
        cfg = self.config
        batch, frames = images.shape[:2] if frame_index is None else frame_index.shape
        height, width = images.shape[-2:]
        rows, cols = height // cfg.patch_size, width // cfg.patch_size
        tokens_per_frame = cfg.patch_start_idx + rows * cols
        cached_frames = 0 if cache is None else self._check_cache(cache, batch, tokens_per_frame)
        attend = self.attention_kernel(images.device).kernel.attend
        run = _Run(tokens_per_frame, self._rope(rows, cols, images.device), attend, cache, cached_frames)

        patches = self.patch_embed(self.normalize(images).reshape(-1, 3, height, width), attend)
        if frame_index is not None:
            patches = patches[frame_index.reshape(-1).to(patches.device)]  # [B*S, N, C]
        special = self._special_tokens(batch, frames, starts_sequence=cached_frames == 0)
        tokens = torch.cat((special.to(patches.dtype), patches), dim=1)  # [B*S, P, C]

        outputs = []
        for i, (frame_block, global_block) in enumerate(zip(self.frame_blocks[: last + 1], self.global_blocks[: last + 1])):
            frame_out = frame_block(tokens, run.rope, run.attend)
            global_out = global_block(
                frame_out.reshape(batch, frames * tokens_per_frame, cfg.embed_dim),
                run.rope,
                functools.partial(self._global_attend, run=run, index=i),
            )
            tokens = global_out.reshape(batch * frames, tokens_per_frame, cfg.embed_dim)
            if keep_all or i == last:
                shape = (batch, frames, tokens_per_frame, cfg.embed_dim)
                outputs.append(torch.cat((frame_out.reshape(shape), global_out.reshape(shape)), dim=-1))
        if cache is not None:
            cache.num_frames += frames
            cache.batch_size, cache.tokens_per_frame = batch, tokens_per_frame
        return outputs

    def _check_cache(self, cache: KVCache, batch: int, tokens_per_frame: int) -> int:
        if len(cache.keys) != self.config.depth:
            raise ValueError(f"KV cache has {len(cache.keys)} blocks, the aggregator has {self.config.depth}")
        if cache.num_frames == 0:
            return 0
        if cache.batch_size != batch or cache.tokens_per_frame != tokens_per_frame:
            raise ValueError(
                f"KV cache holds batch {cache.batch_size} with {cache.tokens_per_frame} tokens per frame; "
                f"got batch {batch} with {tokens_per_frame} tokens per frame (image size changed?)"
            )
        return cache.num_frames

    def _global_attend(self, q: Tensor, k: Tensor, v: Tensor, *, run: _Run, index: int) -> Tensor:
        """Attention across frames for the new frames' q/k/v [B, heads, S*P, hd]."""
        cache = run.cache
        if cache is not None:
            if run.cached_frames:
                cached_k, cached_v = cache.keys[index], cache.values[index]
                if cached_k is None or cached_v is None:
                    raise ValueError(f"KV cache has no entry for global block {index}: it was filled with fewer layers")
                k, v = torch.cat((cached_k, k), dim=2), torch.cat((cached_v, v), dim=2)
            cache.keys[index], cache.values[index] = k, v
        if self.config.attention == "full":
            return run.attend(q, k, v)
        return _block_causal_attention(q, k, v, run.tokens_per_frame, run.cached_frames, run.attend)


def _block_causal_attention(
    q: Tensor, k: Tensor, v: Tensor, tokens_per_frame: int, cached_frames: int, attend: AttendFn
) -> Tensor:
    """Query frame t (after ``cached_frames`` earlier frames) attends to the keys of frames <= t.

    One SDPA call per query frame over a key prefix, so no [S*P, S*P] mask is ever built and
    flash / memory-efficient kernels apply. The frame count is static, so the loop unrolls under
    torch.compile.
    """
    p = tokens_per_frame
    outputs = [
        attend(
            q[:, :, t * p : (t + 1) * p],
            k[:, :, : (cached_frames + t + 1) * p],
            v[:, :, : (cached_frames + t + 1) * p],
        )
        for t in range(q.shape[2] // p)
    ]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)

