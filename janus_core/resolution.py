"""The one definition of a frame *resolution* and what follows from it under VGGT's 14-px patch
grid, which Qwen2.5-VL's ViT shares (:mod:`janus_core.bases`).

A resolution names how a source image becomes a stored uint8 frame: VGGT's ``pad`` or ``crop``
preprocessing at a target size (``pad644`` is what JanusVLN trains on). The name is part of every
frame key and of the cache manifest, so everything that depends on the frame size (patch grid,
visual tokens per image) is derived here and nowhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from janus_core.bases import DEFAULT_BASE, VGGT_PATCH_SIZE, QwenBase

Mode = Literal["pad", "crop"]
MODES: tuple[str, ...] = get_args(Mode)

_NAME_RE = re.compile(r"^(pad|crop)(\d+)$")


def grid_shape(height: int, width: int, patch: int = VGGT_PATCH_SIZE) -> tuple[int, int]:
    """Patch grid ``(h, w)`` of a frame of ``height x width`` pixels; both must be multiples of
    ``patch`` (VGGT's 14 px, which Qwen2.5-VL shares)."""
    if height <= 0 or width <= 0 or height % patch or width % patch:
        raise ValueError(f"frame size {height}x{width} (HxW) is not a positive multiple of the patch size {patch}")
    return height // patch, width // patch


def visual_tokens_for_shape(height: int, width: int, base: QwenBase = DEFAULT_BASE) -> int:
    """Visual tokens of ``base`` for one ``height x width`` frame: its patch grid merged ``merge x
    merge`` (``h*w / 4``; Qwen2.5-VL's patches are VGGT's).

    The merge needs a patch grid of whole merge blocks; another is an error here rather than a silent
    crop (the reference pipeline crops the last patch row/column, which changes the frame).
    """
    h, w = grid_shape(height, width, base.patch_size)
    merge = base.merge_size
    if h % merge or w % merge:
        raise ValueError(
            f"frame size {height}x{width} (HxW) gives a {h}x{w} patch grid; the {merge}x{merge} "
            f"token merge needs both sides divisible by {merge} (a frame side must be a multiple of "
            f"{base.token_pixels} px)"
        )
    return (h * w) // (merge * merge)


@dataclass(frozen=True)
class Resolution:
    """VGGT preprocessing ``mode`` ("pad" or "crop") at ``target`` pixels, e.g. ``pad644``.

    * pad:  the longer side is resized to ``target``, the other to a multiple of 14 keeping the
      aspect ratio, then the frame is padded with white to ``target x target``.
    * crop: the width is resized to ``target``, the height to a multiple of 14 keeping the aspect
      ratio, then a height above ``target`` is centre-cropped to ``target``.
    """

    mode: Mode
    target: int

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"resolution mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.target, bool) or not isinstance(self.target, int):
            raise TypeError(f"resolution target must be an int, got {self.target!r}")
        if self.target <= 0 or self.target % VGGT_PATCH_SIZE:
            raise ValueError(
                f"resolution target must be a positive multiple of the patch size {VGGT_PATCH_SIZE}, got {self.target}"
            )

    @property
    def name(self) -> str:
        """Stable key used in frame keys and manifests, e.g. ``"pad644"``."""
        return f"{self.mode}{self.target}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, value: str | Resolution) -> Resolution:
        """``Resolution.parse("pad644") == Resolution("pad", 644)``; a Resolution is returned as is."""
        if isinstance(value, Resolution):
            return value
        if not isinstance(value, str):
            raise TypeError(f"a resolution is a name like 'pad644', got {type(value).__name__} {value!r}")
        match = _NAME_RE.match(value.strip())
        if match is None:
            raise ValueError(
                f"cannot parse resolution {value!r}: expected '<mode><target>' with mode in {MODES} "
                f"and target a multiple of {VGGT_PATCH_SIZE}, e.g. 'pad644', 'crop644' or 'pad224'"
            )
        try:
            return cls(mode=match.group(1), target=int(match.group(2)))  # type: ignore[arg-type]
        except ValueError as err:  # e.g. pad0, pad13: the message names what was given
            raise ValueError(f"resolution {value!r}: {err}, e.g. 'pad644' or 'pad224'") from None

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """Size ``(new_w, new_h)`` that a ``width x height`` source is resized to (before pad/crop).

        Reproduces VGGT's float64 order of operations exactly: ratio first, then multiply, then
        divide by 14, then Python's round-half-to-even. For 640x480 this gives 644x490, because
        ``480 * (644 / 640)`` is 483.00000000000006 in float64 (exact arithmetic would give 476).
        """
        if width <= 0 or height <= 0:
            raise ValueError(f"source size must be positive, got {width}x{height} (WxH)")
        target = self.target
        if self.mode == "pad" and height > width:
            new_h = target
            new_w = round(width * (target / height) / VGGT_PATCH_SIZE) * VGGT_PATCH_SIZE
        else:
            new_w = target
            new_h = round(height * (target / width) / VGGT_PATCH_SIZE) * VGGT_PATCH_SIZE
        if new_w <= 0 or new_h <= 0:
            raise ValueError(
                f"a {width}x{height} (WxH) source is too elongated for {self.name}: "
                f"its short side would be resized to 0 px"
            )
        return new_w, new_h

    def frame_shape(self, width: int | None = None, height: int | None = None) -> tuple[int, int]:
        """Shape ``(H, W)`` of the stored frame made from a ``width x height`` source.

        A pad frame is always ``target x target``, so the source size is optional there; a crop
        frame's height follows the source aspect ratio and needs it.
        """
        if width is None or height is None:
            if width is not None or height is not None:
                raise ValueError("pass both the source width and height, or neither")
            if self.mode != "pad":
                raise ValueError(
                    f"the frame height of {self.name} depends on the source aspect ratio; "
                    "pass the source width and height"
                )
            return self.target, self.target
        new_w, new_h = self.output_size(width, height)
        if self.mode == "pad":
            return self.target, self.target
        return min(new_h, self.target), new_w

    def patch_grid(self, width: int | None = None, height: int | None = None) -> tuple[int, int]:
        """Patch grid ``(h, w) = (H/14, W/14)`` of the stored frame (source size as in frame_shape)."""
        return grid_shape(*self.frame_shape(width, height))

    def visual_tokens(self, width: int | None = None, height: int | None = None) -> int:
        """Qwen2.5-VL visual tokens per frame, ``h*w/4`` (529 for pad644)."""
        return visual_tokens_for_shape(*self.frame_shape(width, height))


#: The resolution JanusVLN trains on (VGGT pad mode at 644 -> 644x644 frames, 46x46 patches).
DEFAULT_RESOLUTION: Resolution = Resolution("pad", 644)


def visual_tokens(resolution_or_height: Resolution | str | int, width: int | None = None) -> int:
    """Visual tokens per frame, for the prompt builder and metrics.

    ``visual_tokens("pad644")`` / ``visual_tokens(DEFAULT_RESOLUTION)`` -> 529;
    ``visual_tokens(644, 644)`` -> 529 (a frame height and width in pixels).
    """
    if isinstance(resolution_or_height, (Resolution, str)):
        if width is not None:
            raise TypeError("pass a resolution alone, or a frame height and width")
        return Resolution.parse(resolution_or_height).visual_tokens()
    if width is None:
        raise TypeError("visual_tokens(height, width) needs the frame width too")
    return visual_tokens_for_shape(int(resolution_or_height), int(width))
