"""Specification of the VGGT window's speed levers, on CPU in float32.

* frames repeated across (and inside) the windows of one encoder call are patch-embedded once,
  with features bit-identical to embedding every window frame;
* the attention kernel is chosen once per device from a fixed order of exact kernels;
* ``vggt.compile`` fuses the blocks' elementwise work, within verify's tolerance of the eager path
  (tests/e2e/test_vggt_compile.py: the compiler starts worker processes).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.profiles import write_test_profile
from helpers.vggt_cases import CPU, SIDE, episode_windows, tiny_model
from janus_core.profile import load_profile
from janus_core.vggt import VGGTAggregator
from janus_core.vggt.attention import CUDA_ORDER, SDPA, AttentionKernel, candidate, choose, kernel_for
from janus_core.vggt.encoder import PROBE_STRIDE, WindowEncoder, distinct_frames


class PatchEmbedCalls:
    """Frames the DINOv2 patch embedding receives, per call."""

    def __init__(self, model: VGGTAggregator) -> None:
        self.frames: list[int] = []
        self.handle = model.patch_embed.register_forward_pre_hook(lambda _, args: self.frames.append(args[0].shape[0]))


@pytest.fixture(scope="module")
def model() -> VGGTAggregator:
    return tiny_model()


# ------------------------------------------------------------------------------ deduplication


def test_distinct_frames_are_found_exactly_even_when_their_probe_bytes_agree() -> None:
    windows = episode_windows(range(2, 5))  # padded windows: frame 0 repeated inside each window
    twin = windows[0, -1].clone()
    flat = twin.view(-1)
    flat[1] ^= 1  # byte 1 is not a probe byte (every PROBE_STRIDE-th byte is)
    assert PROBE_STRIDE > 1
    windows[1, 0] = twin  # same probe bytes as windows[0, -1], one byte different
    frames, index = distinct_frames(windows)

    assert index.shape == windows.shape[:2]
    assert torch.equal(frames[index], windows)  # every window frame is its distinct frame
    expected = len({bytes(f.numpy().tobytes()) for f in windows.reshape(-1, SIDE, SIDE, 3)})
    assert frames.shape[0] == expected < windows.shape[0] * windows.shape[1]
    assert index[1, 0] != index[0, -1]


@pytest.mark.parametrize("reference_frame", ["first", "last"])
def test_dedup_embeds_each_distinct_frame_once_with_bit_identical_features(
    model: VGGTAggregator, reference_frame: str
) -> None:
    windows = episode_windows([3, 4, 11, 12])  # padded and linspace windows
    calls = PatchEmbedCalls(model)
    per_frame = WindowEncoder(model, reference_frame, -2, torch.float32, dedup=False).encode(windows)
    deduped = WindowEncoder(model, reference_frame, -2, torch.float32, dedup=True).encode(windows)
    calls.handle.remove()

    distinct = len({f.numpy().tobytes() for f in windows.reshape(-1, SIDE, SIDE, 3)})
    assert calls.frames == [4 * 9, distinct]
    assert distinct < 4 * 9 / 2
    assert torch.equal(deduped, per_frame)


def test_features_are_bit_identical_whatever_the_batch_composition(model: VGGTAggregator) -> None:
    windows = episode_windows(range(6, 14))
    encoder = WindowEncoder(model, "last", -2, torch.float32)
    whole = encoder.encode(windows)
    one_by_one = torch.cat([encoder.encode(windows[i : i + 1]) for i in range(len(windows))])
    other_batches = torch.cat([encoder.encode(windows[:3]), encoder.encode(windows[3:])])
    assert torch.equal(whole, one_by_one)
    assert torch.equal(whole, other_batches)


# -------------------------------------------------------------------------- attention kernel


def test_cpu_keeps_pytorch_sdpa_chosen_once_per_device(model: VGGTAggregator) -> None:
    choice = model.attention_kernel(CPU)
    assert choice.kernel.name == SDPA
    assert model.attention_kernel(CPU) is choice
    assert kernel_for(CPU, torch.float32, (16, 32)) is kernel_for(CPU, torch.float32, (16, 32))


def test_the_first_kernel_that_runs_and_is_exact_is_chosen_and_the_rest_reported() -> None:
    choice = choose(CUDA_ORDER, CPU, torch.float32, (16, 64))
    skipped = dict(choice.skipped)
    # FlashAttention-3 is not installed (or runs on GPUs only) and cuDNN attention does not run on a CPU.
    assert list(skipped) == ["flash3", "sdpa-cudnn"]
    if importlib.util.find_spec("flash_attn_interface") is None:
        assert skipped["flash3"] == "not installed"
    assert "backend" in skipped["sdpa-cudnn"]
    assert choice.kernel.name == "sdpa-flash"
    assert choice.describe().startswith("sdpa-flash (skipped flash3: ") and "; sdpa-cudnn: " in choice.describe()


def test_a_kernel_that_is_not_exact_is_passed_over() -> None:
    def unscaled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Softmax without the 1/sqrt(head_dim) scale: fast and wrong.
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    def make(name: str) -> AttentionKernel | None:
        return AttentionKernel(name, unscaled) if name == "broken" else candidate(name)

    choice = choose(["broken", "sdpa-math"], CPU, torch.float32, (64,), make)
    assert choice.kernel.name == "sdpa-math"
    assert choice.skipped[0][0] == "broken" and "off by" in choice.skipped[0][1]


def test_a_forced_kernel_gives_the_same_features_and_unknown_names_are_refused() -> None:
    model = tiny_model()
    images = torch.rand(2, 3, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1))
    automatic = model.window_features(images)
    model.use_attention_kernel("sdpa-math")
    assert model.attention_kernel(CPU).kernel.name == "sdpa-math"
    forced = model.window_features(images)
    model.use_attention_kernel(None)
    assert model.attention_kernel(CPU).kernel.name == SDPA
    assert torch.allclose(forced, automatic, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="unknown attention kernel 'nope'"):
        model.use_attention_kernel("nope")
    sdpa_calls = 0

    def counting(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        nonlocal sdpa_calls
        sdpa_calls += 1
        return F.scaled_dot_product_attention(q, k, v)

    model._forced_kernel = AttentionKernel("counting", counting)
    model.window_features(images, layer=-1)
    # Every attention of the window runs the chosen kernel: 2 DINOv2 blocks, and per block pair
    # one frame attention plus one call per query frame of the block-causal global attention.
    assert sdpa_calls == 2 + 2 * (1 + 3)


# --------------------------------------------------------------------------------- compile


def test_compile_setting_fuses_every_block(tmp_path: Path) -> None:
    profile = load_profile(write_test_profile(tmp_path / "p.yaml", vggt={"compile": True}))
    assert profile.vggt.compile is True
    encoder = WindowEncoder.from_settings(profile.vggt, profile.cache)
    assert encoder.model.fused
    default = load_profile(write_test_profile(tmp_path / "d.yaml"))
    assert default.vggt.compile is False
    assert not WindowEncoder.from_settings(default.vggt, default.cache).model.fused
