"""DINOv2 ViT with register tokens: the aggregator's per-frame patch embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from janus_core.vggt.config import PATCH_EMBED_LAYERNORM_EPS, PATCH_EMBED_LAYERSCALE_INIT, PatchEmbedConfig
from janus_core.vggt.layers import AttendFn, Block, full_attention


class PatchProjection(nn.Module):
    """Non-overlapping patch_size×patch_size convolution; tokens come out row-major."""

    def __init__(self, patch_size: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class DinoVisionTransformer(nn.Module):
    def __init__(self, config: PatchEmbedConfig, img_size: int, patch_size: int) -> None:
        super().__init__()
        dim = config.embed_dim
        self.patch_size = patch_size
        self.grid = img_size // patch_size  # side of the stored positional-embedding grid
        # Parameter order = checkpoint key order.
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.grid * self.grid, dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, config.num_register_tokens, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, dim))  # kept for the checkpoint; unused at inference
        self.patch_embed = PatchProjection(patch_size, dim)
        self.blocks = nn.ModuleList(
            Block(
                dim,
                config.num_heads,
                config.mlp_ratio,
                qkv_bias=True,
                proj_bias=True,
                ffn_bias=True,
                qk_norm=False,
                norm_eps=PATCH_EMBED_LAYERNORM_EPS,
                qk_norm_eps=PATCH_EMBED_LAYERNORM_EPS,
                layerscale_init=PATCH_EMBED_LAYERSCALE_INIT,
            )
            for _ in range(config.depth)
        )
        self.norm = nn.LayerNorm(dim, eps=PATCH_EMBED_LAYERNORM_EPS)

    def interpolated_pos_embed(self, rows: int, cols: int) -> Tensor:
        """Positional embedding [1, 1 + rows*cols, C] (cls entry first) for a rows×cols patch grid.

        The stored square grid is resized with antialiased bicubic interpolation to an explicit
        output size, in float32, also when upsampling: that is what the checkpoint expects.
        """
        if rows == self.grid and cols == self.grid:
            return self.pos_embed
        cls_pos, grid_pos = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        dim = grid_pos.shape[-1]
        grid = grid_pos.reshape(1, self.grid, self.grid, dim).permute(0, 3, 1, 2).float()
        grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", antialias=True, align_corners=False)
        grid = grid.permute(0, 2, 3, 1).reshape(1, rows * cols, dim).to(self.pos_embed.dtype)
        return torch.cat((cls_pos, grid), dim=1)

    def forward(self, images: Tensor, attend: AttendFn = full_attention) -> Tensor:
        """Normalised images [n, 3, H, W] -> final-norm patch tokens [n, (H/p)*(W/p), C].

        Each image is embedded on its own (no attention across images), so a frame's tokens do not
        depend on which other frames share the call.
        """
        n, _, height, width = images.shape
        rows, cols = height // self.patch_size, width // self.patch_size
        x = self.patch_embed(images)
        # Under autocast the conv output is half precision; concatenating with the float32 tokens
        # promotes, so the residual stream stays float32 like the checkpoint's reference runs.
        x = torch.cat((self.cls_token.expand(n, -1, -1), x), dim=1)
        x = x + self.interpolated_pos_embed(rows, cols).to(x.dtype)
        # Registers go right after cls and get no positional embedding.
        x = torch.cat((x[:, :1], self.register_tokens.expand(n, -1, -1), x[:, 1:]), dim=1)
        for block in self.blocks:
            x = block(x, attend=attend)
        return self.norm(x)[:, 1 + self.register_tokens.shape[1] :]
