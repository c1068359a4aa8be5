"""Specification of `janus_core.imaging`: one uint8 frame per source image, and both model inputs
derived from it bit for bit, for each base (Qwen3-VL's own frame and pixel values too).

The references here are written independently of the module: the VGGT preprocessing is redone
with numpy scalars, ``np.pad`` and a torch float path that follows VGGT's
``load_and_preprocess_images`` step by step; Qwen pixel values come from transformers' own image
processor, called the way JanusVLN calls it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from helpers.bases import QWEN3
from janus_core.bases import QWEN2_5_VL, QWEN3_VL
from janus_core.imaging import (
    FrameError,
    load_frame,
    load_qwen_frame,
    qwen_pixel_lut,
    qwen_pixel_values,
    vggt_input,
)
from janus_core.index import DatasetIndex
from janus_core.resolution import Resolution, visual_tokens

# The Qwen2.5-VL facts these tests pin (janus_core.bases).
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH = QWEN2_5_VL.patch_size, QWEN2_5_VL.merge_size, QWEN2_5_VL.temporal_patch
PATCH_DIM, QWEN_IMAGE_MEAN, QWEN_IMAGE_STD = QWEN2_5_VL.patch_dim, QWEN2_5_VL.image_mean, QWEN2_5_VL.image_std
QWEN3_SIDE = 64  # Qwen3-VL's frame of VGGT's pad56: 4x4 patches of 16 px, 2x2 visual tokens

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
NO_TORCHVISION = (
    "torchvision is not installed, so transformers' fast (torchvision) Qwen2VLImageProcessor cannot "
    "be built; the PIL processor (the variant JanusVLN's transformers 4.50 loads) is covered instead"
)


# --------------------------------------------------------------------------------------------
# Test images
# --------------------------------------------------------------------------------------------


def natural_image(width: int, height: int, seed: int) -> np.ndarray:
    """A photo-like uint8 RGB image: smooth gradients, a few solid ellipses, sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    y /= max(height - 1, 1)
    x /= max(width - 1, 1)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.5, 4.0), rng.uniform(0.5, 4.0), rng.uniform(0, 2 * np.pi)
        channels.append(128 + 90 * np.sin(2 * np.pi * (fx * x + fy * y) + phase) * rng.uniform(0.3, 1.0))
    image = np.stack(channels, axis=-1)
    for _ in range(4):
        cx, cy, rx, ry = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3), rng.uniform(0.05, 0.3)
        inside = ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 < 1.0
        image[inside] = rng.uniform(0, 255, size=3)
    image += rng.normal(0.0, 6.0, size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def write_png(path: Path, image: Image.Image | np.ndarray) -> Path:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    image.save(path, format="PNG")
    return path


# --------------------------------------------------------------------------------------------
# Independent references
# --------------------------------------------------------------------------------------------


def reference_resize_size(width: int, height: int, mode: str, target: int) -> tuple[int, int]:
    """VGGT's target size with numpy float64 scalars: ratio, multiply, /14, round half to even."""
    w, h, t, p = np.float64(width), np.float64(height), np.float64(target), np.float64(14)
    if mode == "pad" and height > width:
        return int(np.round(w * (t / h) / p)) * 14, target
    return target, int(np.round(h * (t / w) / p)) * 14


def reference_frame(rgb: Image.Image, mode: str, target: int) -> np.ndarray:
    """The uint8 frame from an already RGB image, padded with np.pad / cropped by slicing."""
    new_w, new_h = reference_resize_size(rgb.width, rgb.height, mode, target)
    pixels = np.array(rgb.resize((new_w, new_h), resample=Image.BICUBIC))
    if mode == "crop":
        start = max(new_h - target, 0) // 2
        return pixels[start : start + min(new_h, target)]
    extra_h, extra_w = target - new_h, target - new_w
    return np.pad(
        pixels,
        ((extra_h // 2, extra_h - extra_h // 2), (extra_w // 2, extra_w - extra_w // 2), (0, 0)),
        mode="constant",
        constant_values=255,
    )


def reference_vggt_float(rgb: Image.Image, mode: str, target: int) -> torch.Tensor:
    """VGGT's float path for one RGB image: resize, ToTensor (uint8 / 255 in float32), then crop
    or pad with the float value 1.0, as in load_and_preprocess_images. Returns [3, H, W]."""
    new_w, new_h = reference_resize_size(rgb.width, rgb.height, mode, target)
    resized = rgb.resize((new_w, new_h), resample=Image.BICUBIC)
    tensor = torch.from_numpy(np.array(resized)).permute(2, 0, 1).contiguous().float().div(255)
    if mode == "crop" and new_h > target:
        start = (new_h - target) // 2
        tensor = tensor[:, start : start + target, :]
    if mode == "pad":
        pad_h, pad_w = target - tensor.shape[1], target - tensor.shape[2]
        if pad_h > 0 or pad_w > 0:
            tensor = F.pad(
                tensor, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), mode="constant", value=1.0
            )
    return tensor


def processor_on_float_tensor(frames: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' PIL Qwen2-VL processor as JanusVLN calls it: one [1, 3, H, W] tensor in [0, 1]
    per image, do_rescale=False, min_pixels = max_pixels = H*W."""
    height, width = frames.shape[1:3]
    processor = Qwen2VLImageProcessorPil(min_pixels=height * width, max_pixels=height * width)
    values, grids = [], []
    for frame in frames:
        live = torch.from_numpy(frame).permute(2, 0, 1).contiguous().float().div(255)[None]
        out = processor(live, do_rescale=False, return_tensors="pt")
        values.append(out["pixel_values"])
        grids.append(out["image_grid_thw"])
    return torch.cat(values), torch.cat(grids)


def processor_on_uint8(frames: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The same processor on the uint8 frames with its default rescaling (1/255)."""
    height, width = frames.shape[1:3]
    processor = Qwen2VLImageProcessorPil(min_pixels=height * width, max_pixels=height * width)
    out = processor(list(frames), return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def frame_set(resolution: Resolution, count: int, seed: int) -> np.ndarray:
    """``count`` frames at ``resolution``: mostly photo-like 640x480 sources through load_frame,
    plus uniform noise (hits every uint8 value of every channel) and all-black/all-white frames."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(count - 4):
        frames.append(load_frame(Image.fromarray(natural_image(640, 480, seed * 1000 + i)), resolution))
    height, width = resolution.frame_shape(640, 480)
    frames.append(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))
    frames.append(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))
    frames.append(np.zeros((height, width, 3), dtype=np.uint8))
    frames.append(np.full((height, width, 3), 255, dtype=np.uint8))
    return np.stack(frames)


# --------------------------------------------------------------------------------------------
# load_frame
# --------------------------------------------------------------------------------------------


def test_640x480_frame_is_resized_to_644x490_and_padded_77_rows_each_side(tmp_path: Path) -> None:
    source = natural_image(640, 480, seed=1)
    frame = load_frame(write_png(tmp_path / "step_0000_MOVE_FORWARD.png", source))

    assert frame.dtype == np.uint8 and frame.shape == (644, 644, 3) and frame.flags.c_contiguous
    assert (frame[:77] == 255).all() and (frame[77 + 490 :] == 255).all()
    expected_content = np.array(Image.fromarray(source).resize((644, 490), Image.BICUBIC))
    np.testing.assert_array_equal(frame[77 : 77 + 490], expected_content)
    np.testing.assert_array_equal(frame, reference_frame(Image.fromarray(source), "pad", 644))


@pytest.mark.parametrize(
    ("width", "height"),
    [(640, 480), (480, 640), (641, 479), (333, 517), (517, 333), (15, 15), (1000, 37), (700, 700)],
)
@pytest.mark.parametrize("mode", ["pad", "crop"])
def test_load_frame_equals_independent_recomputation(tmp_path: Path, width: int, height: int, mode: str) -> None:
    source = natural_image(width, height, seed=width * 7 + height)
    frame = load_frame(write_png(tmp_path / "frame.png", source), mode=mode, target=644)
    np.testing.assert_array_equal(frame, reference_frame(Image.fromarray(source), mode, 644))
    assert frame.shape[:2] == Resolution(mode, 644).frame_shape(width, height)  # type: ignore[arg-type]


def test_crop_mode_keeps_the_centre_rows_of_a_tall_frame(tmp_path: Path) -> None:
    source = natural_image(480, 640, seed=3)
    frame = load_frame(write_png(tmp_path / "tall.png", source), mode="crop")
    resized = np.array(Image.fromarray(source).resize((644, 854), Image.BICUBIC))
    np.testing.assert_array_equal(frame, resized[105 : 105 + 644])


def test_rgba_is_composited_onto_white(tmp_path: Path) -> None:
    """Binary alpha gives an exact expectation (transparent -> white); partial alpha blends."""
    rgb = natural_image(64, 48, seed=4)
    alpha = np.where(np.indices((48, 64)).sum(axis=0) % 3 == 0, 0, 255).astype(np.uint8)
    rgba = Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA")
    frame = load_frame(write_png(tmp_path / "rgba.png", rgba), mode="pad", target=644)

    flattened = np.where(alpha[..., None] == 255, rgb, 255).astype(np.uint8)
    np.testing.assert_array_equal(frame, reference_frame(Image.fromarray(flattened), "pad", 644))

    half = Image.fromarray(np.dstack([rgb, np.full((48, 64), 128, np.uint8)]), mode="RGBA")
    blended = load_frame(half, mode="crop", target=644)
    expected = reference_frame(
        Image.fromarray(np.rint(rgb * (128 / 255) + 255 * (127 / 255)).astype(np.uint8)), "crop", 644
    )
    assert np.abs(blended.astype(int) - expected.astype(int)).max() <= 2


def test_grayscale_is_replicated_to_three_channels(tmp_path: Path) -> None:
    gray = natural_image(320, 240, seed=5)[..., 0]
    frame = load_frame(write_png(tmp_path / "gray.png", Image.fromarray(gray, mode="L")), "pad", 224)
    np.testing.assert_array_equal(frame, reference_frame(Image.fromarray(np.dstack([gray] * 3)), "pad", 224))


def test_palette_image_is_converted_directly_even_with_a_transparent_index(tmp_path: Path) -> None:
    """VGGT composites only RGBA; a palette image's transparent index keeps its palette colour."""
    rng = np.random.default_rng(6)
    palette = rng.integers(0, 256, size=(256, 3), dtype=np.uint8)
    indices = rng.integers(0, 256, size=(90, 120), dtype=np.uint8)
    image = Image.fromarray(indices, mode="P")
    image.putpalette(palette.reshape(-1).tolist())
    image.info["transparency"] = int(indices[0, 0])
    path = tmp_path / "palette.png"
    image.save(path, transparency=int(indices[0, 0]))

    frame = load_frame(path, "pad", 644)
    np.testing.assert_array_equal(frame, reference_frame(Image.fromarray(palette[indices]), "pad", 644))


def test_pil_image_and_resolution_arguments_are_accepted(tmp_path: Path) -> None:
    source = natural_image(640, 480, seed=7)
    path = write_png(tmp_path / "a.png", source)
    by_path = load_frame(path, "pad", 224)
    np.testing.assert_array_equal(load_frame(str(path), Resolution.parse("pad224")), by_path)
    np.testing.assert_array_equal(load_frame(Image.fromarray(source), "pad", 224), by_path)
    np.testing.assert_array_equal(load_frame(path, "pad224"), by_path)
    with pytest.raises(ValueError, match="cannot parse resolution 'fill224'"):
        load_frame(path, "fill224")
    with pytest.raises(TypeError, match="either a resolution"):
        load_frame(path, Resolution.parse("pad224"), 644)


def test_missing_file_error_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "ep1" / "step_0003_STOP.png"
    with pytest.raises(FrameError, match=f"{missing}.*no such file"):
        load_frame(missing)


def test_non_image_file_error_names_the_file(tmp_path: Path) -> None:
    bogus = tmp_path / "step_0001_TURN_LEFT.png"
    bogus.write_text("not a png")
    with pytest.raises(FrameError, match=f"cannot load frame {bogus}"):
        load_frame(bogus)


def test_truncated_png_error_names_the_file(tmp_path: Path) -> None:
    whole = write_png(tmp_path / "whole.png", natural_image(640, 480, seed=8))
    truncated = tmp_path / "step_0002_MOVE_FORWARD.png"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(FrameError, match=f"cannot load frame {truncated}"):
        load_frame(truncated)


def test_too_elongated_source_error_names_the_file(tmp_path: Path) -> None:
    sliver = write_png(tmp_path / "sliver.png", natural_image(2000, 10, seed=9))
    with pytest.raises(FrameError, match=f"{sliver}.*too elongated"):
        load_frame(sliver)


# --------------------------------------------------------------------------------------------
# VGGT input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "mode"), [(640, 480, "pad"), (480, 640, "pad"), (640, 480, "crop"), (480, 640, "crop")]
)
def test_vggt_input_is_bit_identical_to_vggts_float_path(width: int, height: int, mode: str) -> None:
    sources = [Image.fromarray(natural_image(width, height, seed=s)) for s in (10, 11)]
    frames = np.stack([load_frame(s, mode, 644) for s in sources])
    live = torch.stack([reference_vggt_float(s, mode, 644) for s in sources])

    derived = vggt_input(torch.from_numpy(frames))
    assert derived.dtype == torch.float32 and derived.is_contiguous()
    assert torch.equal(derived, live)
    assert torch.equal(vggt_input(frames), live)  # numpy frames too


def test_vggt_padding_is_exactly_one() -> None:
    frames = np.stack([load_frame(Image.fromarray(natural_image(640, 480, seed=12)))])
    assert (vggt_input(frames)[0, :, :77] == 1.0).all()


# --------------------------------------------------------------------------------------------
# Qwen2.5-VL pixel values
# --------------------------------------------------------------------------------------------


def test_qwen_constants_equal_the_transformers_processor_defaults() -> None:
    processor = Qwen2VLImageProcessorPil()
    assert tuple(processor.image_mean) == QWEN_IMAGE_MEAN
    assert tuple(processor.image_std) == QWEN_IMAGE_STD
    assert (processor.patch_size, processor.merge_size, processor.temporal_patch_size) == (
        PATCH_SIZE,
        MERGE_SIZE,
        TEMPORAL_PATCH,
    )


@pytest.mark.parametrize(("resolution", "count"), [("pad644", 20), ("pad224", 24), ("crop224", 20)])
def test_qwen_pixel_values_are_bit_identical_to_transformers(resolution: str, count: int) -> None:
    """Against transformers' PIL processor fed (a) the live [0, 1] float tensor with rescaling off,
    as JanusVLN does, and (b) the uint8 frame with default rescaling. crop224 gives 168x224
    frames, a non-square 12x16 grid, which pins down the row/column order of the patches."""
    frames = frame_set(Resolution.parse(resolution), count, seed=count)
    height, width = frames.shape[1:3]

    pixel_values, grid_thw = qwen_pixel_values(torch.from_numpy(frames))
    live_values, live_grid = processor_on_float_tensor(frames)
    uint8_values, uint8_grid = processor_on_uint8(frames)

    grid = (height // PATCH_SIZE, width // PATCH_SIZE)
    assert pixel_values.shape == (count * grid[0] * grid[1], PATCH_DIM) and pixel_values.dtype == torch.float32
    assert grid_thw.dtype == torch.int64 and grid_thw.tolist() == [[1, *grid]] * count
    assert live_values.dtype == torch.float32
    assert torch.equal(pixel_values, live_values)
    assert torch.equal(grid_thw, live_grid)
    assert torch.equal(pixel_values, uint8_values)
    assert torch.equal(grid_thw, uint8_grid)
    assert int(grid_thw[0].prod()) // MERGE_SIZE**2 == visual_tokens(height, width)


def test_pixel_values_from_stored_frames_equal_qwen3_vls_processor_on_the_same_pngs(
    sample_index: DatasetIndex, tmp_path: Path,
) -> None:
    """Stored uint8 frames (PNG files) -> janus's lookup-table path, against the tiny Qwen3-VL's
    own image processor on the same PNGs (uint8, default rescaling) and on the live [0, 1] float
    tensor with rescaling off: bit for bit. A noise frame hits every uint8 value of every channel;
    a 96x128 frame (3x4 tokens) pins the row/column order."""
    rng = np.random.default_rng(0)
    frames = [load_qwen_frame(frame.path, "pad56", QWEN3_VL) for frame in sample_index.window(sample_index.samples[5])]
    frames.append(rng.integers(0, 256, (QWEN3_SIDE, QWEN3_SIDE, 3), dtype=np.uint8))
    processor = AutoImageProcessor.from_pretrained(QWEN3.qwen_dir)
    for name, group in (("square", frames), ("wide", [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)])):
        paths = []
        for i, frame in enumerate(group):
            paths.append(tmp_path / f"{name}{i}.png")
            Image.fromarray(frame).save(paths[-1])
        stored = np.stack([np.asarray(Image.open(p)) for p in paths])
        height, width = stored.shape[1:3]
        ours, grid = qwen_pixel_values(torch.from_numpy(stored), base=QWEN3_VL)
        no_resize = {"shortest_edge": height * width, "longest_edge": height * width}
        from_pngs = processor([Image.open(p) for p in paths], size=no_resize, return_tensors="pt")
        live = torch.from_numpy(stored).permute(0, 3, 1, 2).float().div(255)
        from_float = processor(list(live), do_rescale=False, size=no_resize, return_tensors="pt")
        assert ours.shape == (len(group) * (height // 16) * (width // 16), 1536) and ours.dtype == torch.float32
        assert grid.tolist() == [[1, height // 16, width // 16]] * len(group)
        assert torch.equal(ours, from_pngs["pixel_values"]) and torch.equal(grid, from_pngs["image_grid_thw"])
        assert torch.equal(ours, from_float["pixel_values"])
    # Not Qwen2.5-VL's numbers: the same frames under the other base's normalisation differ.
    assert not torch.equal(qwen_pixel_values(torch.from_numpy(stored[:, :56, :56]))[0][:, :588],
                           qwen_pixel_values(torch.from_numpy(stored[:, :64, :64]), base=QWEN3_VL)[0][:, :588])


def test_qwen_pixel_values_accept_numpy_frames() -> None:
    frames = frame_set(Resolution.parse("pad224"), 5, seed=3)
    assert torch.equal(qwen_pixel_values(frames)[0], qwen_pixel_values(torch.from_numpy(frames))[0])


def test_patch_layout_is_merge_block_major_then_channel_time_row_column() -> None:
    """A frame whose pixel encodes its own coordinates shows the layout directly: patch row r of the
    output is merge block r // 4, patch (r % 4) of that block in row-major order, and within a row
    the values run channel, time (duplicated), y, x."""
    height, width = 56, 84  # 4x6 patches -> 2x3 merge blocks
    frames = np.zeros((1, height, width, 3), dtype=np.uint8)
    frames[0, :, :, 0] = np.arange(height)[:, None]
    frames[0, :, :, 1] = np.arange(width)[None, :]
    frames[0, :, :, 2] = 7
    pixel_values, _ = qwen_pixel_values(frames)
    lut = qwen_pixel_lut()
    patches = pixel_values.view(24, 3, 2, 14, 14)

    block_cols = width // 28
    for row in range(24):
        block, within = divmod(row, 4)
        patch_y = (block // block_cols) * 2 + within // 2
        patch_x = (block % block_cols) * 2 + within % 2
        ys = torch.arange(patch_y * 14, patch_y * 14 + 14)
        xs = torch.arange(patch_x * 14, patch_x * 14 + 14)
        for t in range(2):
            assert torch.equal(patches[row, 0, t], lut[0, ys][:, None].expand(14, 14))
            assert torch.equal(patches[row, 1, t], lut[1, xs][None, :].expand(14, 14))
            assert torch.equal(patches[row, 2, t], lut[2, 7].expand(14, 14))


def test_the_two_processor_references_differ_in_the_last_bit() -> None:
    """transformers' fast processor on uint8 frames fuses rescale into mean/std (255*mean, 255*std)
    and so disagrees with the float-input path in the last bit for most table entries. JanusVLN
    feeds float tensors, so "float_input" is the default."""
    default, fused = qwen_pixel_lut("float_input"), qwen_pixel_lut("fast_uint8_input")
    differing = default != fused
    assert int(differing.sum()) == 537
    assert float((default - fused).abs().max()) <= 2.4e-7
    frames = frame_set(Resolution.parse("pad224"), 5, seed=4)
    assert not torch.equal(qwen_pixel_values(frames)[0], qwen_pixel_values(frames, "fast_uint8_input")[0])
    with pytest.raises(ValueError, match="unknown pixel reference"):
        qwen_pixel_values(frames, "bf16")  # type: ignore[arg-type]


def test_qwen_pixel_values_reject_bad_frames() -> None:
    with pytest.raises(TypeError, match="uint8"):
        qwen_pixel_values(torch.zeros(1, 28, 28, 3))
    with pytest.raises(ValueError, match=r"\[n, H, W, 3\]"):
        qwen_pixel_values(torch.zeros(28, 28, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="35x46 patch grid"):
        qwen_pixel_values(torch.zeros(1, 490, 644, 3, dtype=torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_gpu_results_equal_cpu_results() -> None:
    frames = torch.from_numpy(frame_set(Resolution.parse("pad644"), 6, seed=5))
    cpu_values, cpu_grid = qwen_pixel_values(frames)
    gpu_values, gpu_grid = qwen_pixel_values(frames.cuda())
    assert gpu_values.is_cuda and torch.equal(gpu_values.cpu(), cpu_values)
    assert torch.equal(gpu_grid.cpu(), cpu_grid)
    assert torch.equal(vggt_input(frames.cuda()).cpu(), vggt_input(frames))


@pytest.mark.skipif(not HAS_TORCHVISION, reason=NO_TORCHVISION)
def test_fast_processor_on_the_float_tensor_matches_the_default() -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    frames = frame_set(Resolution.parse("pad224"), 8, seed=6)
    processor = Qwen2VLImageProcessor(min_pixels=224 * 224, max_pixels=224 * 224)
    live = torch.from_numpy(frames).permute(0, 3, 1, 2).float().div(255)
    out = processor(list(live), do_rescale=False, return_tensors="pt")
    assert torch.equal(qwen_pixel_values(frames)[0], out["pixel_values"])


@pytest.mark.skipif(not HAS_TORCHVISION, reason=NO_TORCHVISION)
def test_fast_processor_on_uint8_frames_matches_the_fused_reference_only() -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    frames = frame_set(Resolution.parse("pad224"), 8, seed=7)
    processor = Qwen2VLImageProcessor(min_pixels=224 * 224, max_pixels=224 * 224)
    out = processor(list(torch.from_numpy(frames).permute(0, 3, 1, 2)), return_tensors="pt")
    assert torch.equal(qwen_pixel_values(frames, "fast_uint8_input")[0], out["pixel_values"])
    assert not torch.equal(qwen_pixel_values(frames)[0], out["pixel_values"])
