"""Specification of `janus_core.resolution`: the one place that defines frame resolutions."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from janus_core.bases import QWEN2_5_VL, QWEN3_VL
from janus_core.resolution import (
    DEFAULT_RESOLUTION,
    Resolution,
    grid_shape,
    visual_tokens,
    visual_tokens_for_shape,
)


def test_patch_constants_describe_qwen25vl_patches() -> None:
    assert (QWEN2_5_VL.patch_size, QWEN2_5_VL.merge_size, QWEN2_5_VL.temporal_patch) == (14, 2, 2)
    assert QWEN2_5_VL.patch_dim == 3 * 2 * 14 * 14 == 1176


def test_default_resolution_is_vggt_pad_mode_at_644() -> None:
    assert DEFAULT_RESOLUTION == Resolution("pad", 644)
    assert DEFAULT_RESOLUTION.name == "pad644"
    assert DEFAULT_RESOLUTION.frame_shape() == (644, 644)
    assert DEFAULT_RESOLUTION.patch_grid() == (46, 46)
    assert DEFAULT_RESOLUTION.visual_tokens() == 529


@pytest.mark.parametrize("name", ["pad644", "crop644", "pad224", "crop518"])
def test_names_parse_back_to_the_same_resolution(name: str) -> None:
    resolution = Resolution.parse(name)
    assert resolution.name == name
    assert str(resolution) == name
    assert Resolution.parse(resolution) is resolution


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("square644", "cannot parse resolution 'square644'"),
        ("pad", "cannot parse resolution 'pad'"),
        ("", "cannot parse resolution ''"),
        ("pad645", "multiple of the patch size 14, got 645"),
        ("crop0", "positive multiple"),
    ],
)
def test_bad_resolution_names_are_rejected_with_a_reason(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        Resolution.parse(text)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="name like 'pad644'"):
        Resolution.parse(644)  # type: ignore[arg-type]


def test_constructor_validates_mode_and_target() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        Resolution("stretch", 644)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an int"):
        Resolution("pad", 644.0)  # type: ignore[arg-type]


def test_resolution_is_a_frozen_hashable_value() -> None:
    resolution = Resolution("pad", 644)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolution.target = 518  # type: ignore[misc]
    assert {resolution: 1}[Resolution.parse("pad644")] == 1


def test_640x480_tie_case_resizes_to_644x490_in_float64_order() -> None:
    """480 * (644/640) is 483.00000000000006 in float64, so /14 rounds up to 35 rows of patches.

    Exact arithmetic gives 34.5, which round-half-to-even would send to 34 (476 px): an
    implementation that multiplies first or uses exact fractions gets a different image.
    """
    assert Resolution("pad", 644).output_size(640, 480) == (644, 490)
    assert round(Fraction(480 * 644, 640 * 14)) * 14 == 476
    assert Resolution("crop", 644).output_size(640, 480) == (644, 490)


def test_pad_mode_scales_the_longer_side_of_a_portrait_source() -> None:
    assert Resolution("pad", 644).output_size(480, 640) == (490, 644)
    assert Resolution("pad", 644).frame_shape(480, 640) == (644, 644)


def test_crop_mode_always_scales_the_width_and_crops_tall_frames() -> None:
    crop = Resolution("crop", 644)
    # 640 * (644/480) / 14 = 61.33 -> 61 patches -> 854 rows, centre-cropped to 644.
    assert crop.output_size(480, 640) == (644, 854)
    assert crop.frame_shape(480, 640) == (644, 644)
    assert crop.frame_shape(640, 480) == (490, 644)
    assert crop.patch_grid(640, 480) == (35, 46)


def test_crop_frame_shape_needs_the_source_size() -> None:
    with pytest.raises(ValueError, match="depends on the source aspect ratio"):
        Resolution("crop", 644).frame_shape()
    with pytest.raises(ValueError, match="both the source width and height"):
        Resolution("pad", 644).frame_shape(640, None)


def test_a_too_elongated_source_is_an_error_not_an_empty_frame() -> None:
    with pytest.raises(ValueError, match="too elongated for pad644"):
        Resolution("pad", 644).output_size(4000, 20)


def test_visual_tokens_per_frame() -> None:
    assert visual_tokens("pad644") == 529
    assert visual_tokens(DEFAULT_RESOLUTION) == 529
    assert visual_tokens(644, 644) == 529
    assert visual_tokens("pad224") == 64
    # crop224 on a 4:3 source: 224x168 px, a 12x16 patch grid, 48 tokens.
    assert Resolution("crop", 224).visual_tokens(640, 480) == 48
    assert visual_tokens_for_shape(168, 224) == 48
    # Each base counts its own: Qwen3-VL's 16-px patches, 32 px per token (its pad640 pairs VGGT's pad560).
    assert visual_tokens_for_shape(640, 640, QWEN3_VL) == 400 == visual_tokens_for_shape(560, 560, QWEN2_5_VL)
    with pytest.raises(ValueError, match=r"gives a 5x5 patch grid.*multiple of 32 px"):
        visual_tokens_for_shape(80, 80, QWEN3_VL)


def test_an_odd_patch_grid_has_no_token_count() -> None:
    """crop644 on 640x480 frames is 490x644 = a 35x46 grid, which the 2x2 merge cannot tile."""
    with pytest.raises(ValueError, match="35x46 patch grid.*divisible by 2"):
        Resolution("crop", 644).visual_tokens(640, 480)


def test_grid_shape_rejects_sizes_that_are_not_whole_patches() -> None:
    assert grid_shape(644, 490) == (46, 35)
    with pytest.raises(ValueError, match="not a positive multiple of the patch size 14"):
        grid_shape(640, 480)


def test_visual_tokens_argument_forms() -> None:
    with pytest.raises(TypeError, match="needs the frame width"):
        visual_tokens(644)
    with pytest.raises(TypeError, match="resolution alone"):
        visual_tokens("pad644", 644)
