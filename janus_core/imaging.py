"""Frames and the exact pixel path.

A source image becomes one uint8 frame [H, W, 3] (VGGT's preprocessing, :func:`load_frame`). Both
model inputs are derived from that frame bit for bit:

* VGGT input  (:func:`vggt_input`):        ``k / 255`` in float32, [S, 3, H, W];
* Qwen pixel values (:func:`qwen_pixel_values`, for the base's patch geometry and normalisation,
  :mod:`janus_core.bases`): a per-channel 3x256 lookup table for rescale + normalise, then
  patchify with temporal duplication in transformers' layout.

Every model-input value depends on one uint8 value ``k`` and one channel ``c`` only, so a table
indexed by ``(c, k)`` reproduces the float arithmetic of the live pipeline exactly, on any device.
The tables are always computed on the CPU, where the live pipeline computes (on CUDA, PyTorch may
divide by a scalar as a multiplication by its reciprocal, which is not bit-identical); only the
lookup runs on the frames' device.
"""

from __future__ import annotations

from functools import cache, lru_cache
from os import PathLike
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image

from janus_core.bases import DEFAULT_BASE, VGGT_PATCH_SIZE, QwenBase
from janus_core.resolution import (
    DEFAULT_RESOLUTION,
    MODES,
    Mode,
    Resolution,
    visual_tokens,
    visual_tokens_for_shape,
)

__all__ = [
    "FrameError",
    "PixelReference",
    "load_frame",
    "load_qwen_frame",
    "qwen_pixel_lut",
    "qwen_pixel_values",
    "vggt_input",
    "vggt_lut",
    "visual_tokens",
    "visual_tokens_for_shape",
]

#: Which transformers computation :func:`qwen_pixel_values` reproduces.
#:
#: * ``"float_input"`` (default): the processor applied to the live [0, 1] float tensor
#:   (``k/255`` in float32) with ``do_rescale=False``, as JanusVLN does (transformers 4.50 loads
#:   the PIL/"slow" processor for Qwen2.5-VL). It computes ``(x - mean) / std`` in float32. Its
#:   same-size "resize" round-trips the float tensor through uint8 and back as float64 ``k*(1/255)``
#:   rounded to float32, which equals the float32 ``k/255`` for every k, so the same bits come out;
#:   likewise for the PIL processor on the uint8 frame with default rescaling. The torchvision
#:   ("fast") processor on the float tensor does the same float32 arithmetic (tested when
#:   torchvision is installed).
#: * ``"fast_uint8_input"``: the torchvision ("fast") processor applied to the uint8 frame with
#:   default rescaling. It fuses the rescale into the normalisation, ``(k - 255*mean) /
#:   (255*std)`` in float32, which differs from the default by at most one float32 rounding step
#:   in 537 of the 768 table entries.
PixelReference = Literal["float_input", "fast_uint8_input"]

ImageSource = str | PathLike | Image.Image


class FrameError(ValueError):
    """A source image cannot be turned into a frame; the message names the file."""


# --------------------------------------------------------------------------------------------
# Source image -> uint8 frame
# --------------------------------------------------------------------------------------------


def _resolve_resolution(mode: Mode | str | Resolution, target: int | None) -> Resolution:
    if isinstance(mode, str) and mode not in MODES:
        mode = Resolution.parse(mode)  # a resolution name such as "pad644"
    if isinstance(mode, Resolution):
        if target is not None and target != mode.target:
            raise TypeError(f"pass either a resolution ({mode.name}) or mode and target, not both")
        return mode
    return Resolution(mode=mode, target=DEFAULT_RESOLUTION.target if target is None else target)  # type: ignore[arg-type]


def _describe(source: ImageSource) -> str:
    if isinstance(source, Image.Image):
        filename = getattr(source, "filename", "")
        return (
            f"PIL image {filename}"
            if filename
            else f"in-memory PIL image ({source.mode}, {source.size[0]}x{source.size[1]})"
        )
    return str(Path(source))


def _to_rgb(img: Image.Image) -> Image.Image:
    # VGGT composites only true RGBA onto white; every other mode (L, P, LA, ...) is converted
    # directly, so a transparent palette pixel keeps its palette colour.
    if img.mode == "RGBA":
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, img)
    return img.convert("RGB")


def _decode_rgb(source: ImageSource, name: str) -> Image.Image:
    if isinstance(source, Image.Image):
        return _to_rgb(source)
    path = Path(source)
    if not path.is_file():
        raise FrameError(f"cannot load frame {name}: no such file")
    try:
        with Image.open(path) as img:
            img.load()  # decode now, inside the try, so a truncated file fails here with its name
            return _to_rgb(img)
    except FrameError:
        raise
    except Exception as exc:  # PIL raises a zoo of types for bad files; all mean "cannot decode"
        raise FrameError(f"cannot load frame {name}: {type(exc).__name__}: {exc}") from exc


def load_frame(
    source: ImageSource,
    mode: Mode | str | Resolution = "pad",
    target: int | None = None,
) -> np.ndarray:
    """Decode and resize one source image to a uint8 frame [H, W, 3], exactly as VGGT does.

    ``source`` is a path or a PIL image. ``mode`` is ``"pad"`` or ``"crop"`` with ``target``
    (default 644), or a :class:`Resolution` or its name such as ``"pad644"`` (then leave
    ``target`` out).

    Steps (VGGT ``load_and_preprocess_images``): RGBA is composited onto white, other modes are
    converted to RGB directly; PIL bicubic resize to :meth:`Resolution.output_size`; crop mode
    keeps the centre ``target`` rows of a taller image; pad mode centres the image on a white
    ``target x target`` canvas (odd pixel to the bottom/right). Padding is stored as 255 so that
    ``k/255`` reproduces VGGT's float padding value 1.0 exactly.
    """
    resolution = _resolve_resolution(mode, target)
    name = _describe(source)
    rgb = _decode_rgb(source, name)
    width, height = rgb.size
    try:
        new_w, new_h = resolution.output_size(width, height)
    except ValueError as exc:
        raise FrameError(f"cannot load frame {name}: {exc}") from exc
    return _fit(rgb, resolution.mode, (new_w, new_h), resolution.target)


def load_qwen_frame(source: ImageSource, resolution: Mode | str | Resolution, base: QwenBase) -> np.ndarray:
    """The base's uint8 frame of a source image, paired with VGGT's frame :func:`load_frame` makes
    at ``resolution`` (the grid rule of :mod:`janus_core.bases`).

    For a base with VGGT's 14-px patches (Qwen2.5-VL) that is the VGGT frame itself. Otherwise the
    same preprocessing runs with every side counted in the base's patches instead of 14 px: the
    resize keeps VGGT's patch counts (from VGGT's own float computation) and the pad/crop target
    is ``target / 14`` patches, so VGGT patch (i, j) and the base's patch (i, j) cover the same part
    of the source (pad560 -> a 640x640 Qwen3-VL frame; pad56 -> 64x64).
    """
    resolution = _resolve_resolution(resolution, None)
    if base.patch_size == VGGT_PATCH_SIZE:
        return load_frame(source, resolution)
    name = _describe(source)
    rgb = _decode_rgb(source, name)
    try:
        new_w, new_h = resolution.output_size(*rgb.size)
    except ValueError as exc:
        raise FrameError(f"cannot load frame {name}: {exc}") from exc
    p, q = VGGT_PATCH_SIZE, base.patch_size
    return _fit(rgb, resolution.mode, (new_w // p * q, new_h // p * q), resolution.target // p * q)


def _fit(rgb: Image.Image, mode: str, size: tuple[int, int], target: int) -> np.ndarray:
    """VGGT's resize to ``size`` (w, h), then white padding to ``target`` square (pad) or a centre
    crop of the rows beyond ``target`` (crop)."""
    new_w, new_h = size
    resized = np.asarray(rgb.resize((new_w, new_h), Image.Resampling.BICUBIC), dtype=np.uint8)
    if mode == "crop":
        if new_h > target:
            top = (new_h - target) // 2
            resized = resized[top : top + target]
        return np.ascontiguousarray(resized)

    frame = np.full((target, target, 3), 255, dtype=np.uint8)
    top = (target - new_h) // 2
    left = (target - new_w) // 2
    frame[top : top + new_h, left : left + new_w] = resized
    return frame


# --------------------------------------------------------------------------------------------
# uint8 frames -> model inputs
# --------------------------------------------------------------------------------------------


# Frame-by-frame lookups: the lookups run one frame at a time into a preallocated output. A whole
# batch at once needs an int64 index of 8 bytes per value (90 MB for nine 644x644 frames); such
# large temporaries are fresh memory maps on every call and cost more in page faults than the
# lookup itself (5-7x slower measured on a 2-core VM). The loop is over frames, never pixels.


def _as_frames(frames: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(frames, np.ndarray):
        frames = torch.from_numpy(np.ascontiguousarray(frames))
    if not isinstance(frames, torch.Tensor):
        raise TypeError(f"frames must be a uint8 torch.Tensor or numpy array, got {type(frames).__name__}")
    if frames.dtype != torch.uint8:
        raise TypeError(f"frames must be uint8 [n, H, W, 3], got dtype {frames.dtype}")
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [n, H, W, 3], got shape {tuple(frames.shape)}")
    return frames.contiguous()


@cache
def _vggt_lut_cpu() -> torch.Tensor:
    # The same op as torchvision's ToTensor: uint8 -> float32, then divide by 255 on the CPU.
    return torch.arange(256, dtype=torch.uint8).to(torch.float32).div(255)


@cache
def _qwen_lut_cpu(reference: PixelReference, base: QwenBase = DEFAULT_BASE) -> torch.Tensor:
    mean = torch.tensor(base.image_mean, dtype=torch.float32)[:, None]
    std = torch.tensor(base.image_std, dtype=torch.float32)[:, None]
    if reference == "float_input":
        # (x - mean) / std in float32 on x = k/255 (float32): transformers' normalise on the
        # [0, 1] tensor, two separately rounded float32 operations.
        return ((_vggt_lut_cpu()[None, :] - mean) / std).contiguous()
    if reference == "fast_uint8_input":
        # The fast processor folds the rescale into mean and std (each times 1/(1/255) = 255
        # in float32) and normalises the raw integer values.
        k = torch.arange(256, dtype=torch.float32)[None, :]
        return ((k - mean * 255.0) / (std * 255.0)).contiguous()
    raise ValueError(f"unknown pixel reference {reference!r}; expected 'float_input' or 'fast_uint8_input'")


@lru_cache(maxsize=32)
def _on_device(table: str, reference: str, device: torch.device, base: QwenBase = DEFAULT_BASE) -> torch.Tensor:
    lut = _vggt_lut_cpu() if table == "vggt" else _qwen_lut_cpu(reference, base)  # type: ignore[arg-type]
    return lut.to(device)


def vggt_lut() -> torch.Tensor:
    """The 256-entry float32 table ``k/255`` used by :func:`vggt_input` (a CPU copy)."""
    return _vggt_lut_cpu().clone()


def qwen_pixel_lut(reference: PixelReference = "float_input", base: QwenBase = DEFAULT_BASE) -> torch.Tensor:
    """The [3, 256] float32 table of a base's normalised pixel values per channel and uint8 value."""
    return _qwen_lut_cpu(reference, base).clone()


def vggt_input(frames: torch.Tensor | np.ndarray) -> torch.Tensor:
    """VGGT input from uint8 frames [S, H, W, 3]: float32 [S, 3, H, W] = ``k/255``.

    Bit-identical to the float tensor of VGGT's ``load_and_preprocess_images`` (ToTensor on the
    CPU, white padding 1.0), on the frames' device (CPU or GPU).
    """
    frames = _as_frames(frames)
    n, height, width, _ = frames.shape
    lut = _on_device("vggt", "", frames.device)
    out = torch.empty((n, 3, height, width), dtype=torch.float32, device=frames.device)
    for i in range(n):  # frame by frame: the int64 index stays small (see "Frame-by-frame lookups")
        index = frames[i].permute(2, 0, 1).to(torch.int64, memory_format=torch.contiguous_format)
        torch.index_select(lut, 0, index.view(-1), out=out[i].view(-1))
    return out


def qwen_pixel_values(
    frames: torch.Tensor | np.ndarray,
    reference: PixelReference = "float_input",
    base: QwenBase = DEFAULT_BASE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A base's ``(pixel_values [n*h*w, patch_dim] float32, image_grid_thw [n, 3] int64)``.

    ``frames`` is uint8 [n, H, W, 3] (torch on any device, or numpy); H and W must be whole visual
    tokens of ``base`` (multiples of 28 for Qwen2.5-VL, 32 for Qwen3-VL). The result equals
    transformers' image processor of the base (Qwen2-VL's, with the base's patch size and
    mean/std) with ``min_pixels = max_pixels = H*W`` (no resize) applied to each frame, bit for
    bit, and is on the frames' device. ``reference`` picks which processor computation to match
    (see :data:`PixelReference`); the default is the live JanusVLN path.

    Layout per frame, as transformers produces it: rows ordered by 2x2 merge block (block row,
    block column, then the 4 patches of the block row-major); each row is channel-major
    ``[C=3, T=2, p, p]`` (p = 14 or 16) with the frame duplicated along T.
    """
    frames = _as_frames(frames)
    n, height, width, _ = frames.shape
    if base is DEFAULT_BASE:
        visual_tokens_for_shape(height, width)  # validates the size with the resolution's message
    gh, gw = base.patch_grid(height, width)
    m, p, t = base.merge_size, base.patch_size, base.temporal_patch

    lut = _on_device("qwen", reference, frames.device, base).view(-1)
    channel_offset = torch.arange(3, device=frames.device, dtype=torch.int64).mul_(256).view(3, 1, 1)
    per_frame = gh * gw
    out = torch.empty((n * per_frame, base.patch_dim), dtype=torch.float32, device=frames.device)
    out_patches = out.view(n, per_frame, 3, t, p * p)
    for i in range(n):  # frame by frame: the int64 index stays small (see "Frame-by-frame lookups")
        # Reorder the uint8 frame first (1 byte per value), then look up into the final order:
        # [block_row, block_col, row_in_block, col_in_block, channel, y, x].
        blocks = frames[i].view(gh // m, m, p, gw // m, m, p, 3).permute(0, 3, 1, 4, 6, 2, 5)
        index = blocks.to(torch.int64, memory_format=torch.contiguous_format).add_(channel_offset)
        values = lut[index].view(per_frame, 3, 1, p * p)
        out_patches[i].copy_(values.expand(-1, -1, t, -1))  # temporal duplication
    grid_thw = torch.tensor([1, gh, gw], dtype=torch.int64, device=frames.device).repeat(n, 1)
    return out, grid_thw
