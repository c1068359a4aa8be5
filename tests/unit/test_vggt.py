"""Specification of the frozen VGGT aggregator (janus_core.vggt), checked in float32 on CPU.

Golden vectors in tests/data/vggt_golden come from the public JanusVLN implementation run on a
tiny random-weight aggregator (see config.json there); tolerance 5e-5 absolute.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.vggt_golden_weights import GOLDEN_DIR, write_golden_weights
from janus_core.vggt import AggregatorConfig, VGGTAggregator, window_flops

ATOL = 5e-5


def golden(name: str) -> torch.Tensor:
    return torch.from_numpy(np.load(GOLDEN_DIR / f"{name}.npy"))


def tiny_config(**overrides: Any) -> dict[str, Any]:
    config = json.loads((GOLDEN_DIR / "config.json").read_text())["aggregator"]
    return {**config, **overrides}


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_golden_weights(tmp_path_factory.mktemp("golden") / "tiny_vggt_aggregator.safetensors")


def load_tiny(weights_file: Path, **overrides: Any) -> VGGTAggregator:
    return VGGTAggregator.from_pretrained(weights_file, config=tiny_config(**overrides))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def model(weights_file: Path) -> VGGTAggregator:
    return load_tiny(weights_file)


@pytest.fixture(scope="module")
def full_model(weights_file: Path) -> VGGTAggregator:
    return load_tiny(weights_file, attention="full")


@pytest.fixture(scope="module")
def window() -> torch.Tensor:
    """The golden window: [B=1, S=3, 3, 84, 112] in [0, 1]."""
    return golden("inputs")


@pytest.fixture(scope="module")
def long_windows() -> torch.Tensor:
    """Three different 5-frame windows [3, 5, 3, 42, 56] with values in [0, 1]."""
    return torch.rand(3, 5, 3, 42, 56, generator=torch.Generator().manual_seed(7))


# ----------------------------------------------------------------------------- goldens


def test_patch_embed_output_matches_golden(model: VGGTAggregator, window: torch.Tensor) -> None:
    """DINOv2 final-norm patch tokens of the ResNet-normalised frames."""
    with torch.no_grad():
        tokens = model.patch_embed(model.normalize(window)[0])
    assert tokens.shape == (3, 48, 128)
    assert max_diff(tokens, golden("dino_x_norm_patchtokens")) <= ATOL


def test_pos_embed_interpolation_for_84x112_matches_golden(model: VGGTAggregator) -> None:
    """Antialiased bicubic resize of the 37×37 grid to 6 rows × 8 columns, cls entry untouched."""
    with torch.no_grad():
        pos = model.patch_embed.interpolated_pos_embed(84 // 14, 112 // 14)
    assert pos.shape == (1, 49, 128)
    assert max_diff(pos, golden("pos_embed_interp_6x8")) <= ATOL
    assert torch.equal(pos[:, 0], model.patch_embed.pos_embed[:, 0])


def test_pos_embed_is_used_unchanged_at_the_native_square_size(model: VGGTAggregator) -> None:
    grid = model.config.img_size // model.config.patch_size
    assert model.patch_embed.interpolated_pos_embed(grid, grid) is model.patch_embed.pos_embed


def test_one_pass_forward_matches_golden_for_every_layer(model: VGGTAggregator, window: torch.Tensor) -> None:
    outputs = model(window)
    expected = golden("a_full_forward_all_layers")
    assert len(outputs) == model.config.depth == expected.shape[0]
    for layer, (out, ref) in enumerate(zip(outputs, expected)):
        assert out.shape == (1, 3, 53, 256), layer
        assert max_diff(out, ref) <= ATOL, f"layer {layer}"


def test_window_features_first_matches_golden(model: VGGTAggregator, window: torch.Tensor) -> None:
    features = model.window_features(window, reference_frame="first", layer=-2)
    assert features.shape == (1, 48, 256)
    assert max_diff(features, golden("b_stream_first_feats")) <= ATOL


# ------------------------------------------------------------------- attention semantics


def test_streaming_one_frame_at_a_time_equals_one_pass_causal(model: VGGTAggregator, window: torch.Tensor) -> None:
    one_pass = model(window)
    cache = model.new_cache()
    for t in range(window.shape[1]):
        step = model.stream_step(window[:, t : t + 1], cache)
        assert cache.num_frames == t + 1
        for layer, out in enumerate(step):
            assert out.shape == (1, 1, 53, 256)
            assert max_diff(out[:, 0], one_pass[layer][:, t]) <= 1e-5, (t, layer)


def test_streaming_accepts_several_frames_per_step(model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    """A stream fed 2 frames, then 3, equals the one-pass forward over all 5 (batched too)."""
    one_pass = model(long_windows)
    cache = model.new_cache()
    first = model.stream_step(long_windows[:, :2], cache)
    second = model.stream_step(long_windows[:, 2:], cache)
    for layer in range(model.config.depth):
        streamed = torch.cat((first[layer], second[layer]), dim=1)
        assert max_diff(streamed, one_pass[layer]) <= 1e-5, layer
    # The cache holds every frame's keys for every global block.
    heads, head_dim = model.config.num_heads, model.config.head_dim
    assert all(k.shape == (3, heads, 5 * cache.tokens_per_frame, head_dim) for k in cache.keys)


def test_streaming_rejects_a_cache_of_another_image_size(model: VGGTAggregator, window: torch.Tensor) -> None:
    cache = model.new_cache()
    model.stream_step(window[:, :1], cache)
    with pytest.raises(ValueError, match="tokens per frame"):
        model.stream_step(window[:, 1:2, :, :70], cache)


def test_streaming_cannot_serve_layers_it_was_not_filled_for(model: VGGTAggregator, window: torch.Tensor) -> None:
    cache = model.new_cache()
    model.stream_step(window[:, :1], cache, last_layer=0)
    with pytest.raises(ValueError, match="global block 1"):
        model.stream_step(window[:, 1:2], cache)


def test_streaming_requires_causal_attention(full_model: VGGTAggregator, window: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="causal"):
        full_model.stream_step(window[:, :1], full_model.new_cache())


def test_causal_frames_never_depend_on_later_frames(model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    changed = long_windows.clone()
    changed[:, 3:] = torch.rand_like(changed[:, 3:])
    for a, b in zip(model(long_windows), model(changed)):
        assert max_diff(a[:, :3], b[:, :3]) == 0.0
        assert max_diff(a[:, 3:], b[:, 3:]) > 1e-2


def test_full_attention_differs_from_causal_exactly_where_it_must(
    model: VGGTAggregator, full_model: VGGTAggregator, long_windows: torch.Tensor
) -> None:
    """Both modes share the frame blocks; they part at the first global block, except for the
    last frame, which sees every frame in both modes. From block pair 1 on it differs too, though
    only second-order (through the earlier frames' keys), hence the small threshold."""
    causal, full = model(long_windows), full_model(long_windows)
    c = model.config.embed_dim
    frame_half, global_half = slice(0, c), slice(c, 2 * c)
    assert max_diff(causal[0][..., frame_half], full[0][..., frame_half]) == 0.0
    assert max_diff(causal[0][:, -1, :, global_half], full[0][:, -1, :, global_half]) <= 1e-6
    for t in range(long_windows.shape[1] - 1):
        assert max_diff(causal[0][:, t, :, global_half], full[0][:, t, :, global_half]) > 1e-3, t
    assert max_diff(causal[1][:, -1], full[1][:, -1]) > 2e-6


def test_full_attention_lets_earlier_frames_see_later_ones(full_model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    changed = long_windows.clone()
    changed[:, -1] = torch.rand_like(changed[:, -1])
    assert max_diff(full_model(long_windows)[-1][:, 0], full_model(changed)[-1][:, 0]) > 1e-4


def test_block_causal_attention_builds_no_mask_and_no_full_window_scores(
    model: VGGTAggregator, long_windows: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every SDPA call is unmasked and has at most one frame of queries."""
    calls: list[tuple[int, int, bool]] = []
    real_sdpa = F.scaled_dot_product_attention

    def recording_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((q.shape[-2], k.shape[-2], kwargs.get("attn_mask") is not None or len(args) > 0))
        return real_sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording_sdpa)
    model(long_windows)
    tokens = model.config.tokens_per_frame(42, 56)
    global_calls = [call for call in calls if call[1] > tokens]
    assert calls and not any(masked for *_, masked in calls)
    assert max(queries for queries, _, _ in calls) <= tokens
    assert sorted({keys for _, keys, _ in global_calls}) == [n * tokens for n in range(2, 6)]


def test_first_frame_uses_slot_0_and_later_frames_slot_1(
    model: VGGTAggregator, window: torch.Tensor, weights_file: Path
) -> None:
    reference = model(window)
    altered = load_tiny(weights_file)
    with torch.no_grad():
        altered.camera_token[:, 1] += 1.0
        altered.register_token[:, 1] += 1.0
    outputs = altered(window)
    assert max_diff(outputs[0][:, 0], reference[0][:, 0]) == 0.0
    assert max_diff(outputs[0][:, 1:], reference[0][:, 1:]) > 1e-2


# ----------------------------------------------------------------- batching and selection


def test_batched_windows_equal_each_window_alone(model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    batched = model(long_windows)
    batched_features = model.window_features(long_windows)
    for b in range(long_windows.shape[0]):
        alone = model(long_windows[b : b + 1])
        for layer in range(model.config.depth):
            assert max_diff(batched[layer][b : b + 1], alone[layer]) <= 1e-5, (b, layer)
        assert max_diff(batched_features[b : b + 1], model.window_features(long_windows[b : b + 1])) <= 1e-5


def test_reference_frame_last_equals_the_reversed_window(model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    """'last' processes the window newest-first and returns the oldest frame's features."""
    last = model.window_features(long_windows, reference_frame="last")
    reversed_pass = model(long_windows.flip(1))[-2][:, -1, model.config.patch_start_idx :]
    assert max_diff(last, reversed_pass) == 0.0
    assert max_diff(last, model.window_features(long_windows.flip(1), reference_frame="first")) == 0.0
    assert max_diff(last, model.window_features(long_windows, reference_frame="first")) > 1e-2


def test_layer_selection_matches_the_full_forward(model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    full = model(long_windows)
    start = model.config.patch_start_idx
    prefix = model(long_windows, last_layer=0)
    assert len(prefix) == 1 and torch.equal(prefix[0], full[0])
    for layer in (0, 1, -1, -2):
        features = model.window_features(long_windows, layer=layer)
        assert torch.equal(features, full[layer][:, -1, start:]), layer


def test_blocks_after_the_requested_layer_are_not_run(model: VGGTAggregator, long_windows: torch.Tensor) -> None:
    ran: list[str] = []
    hooks = [
        block.register_forward_hook(lambda module, args, out, name=f"{kind}.{i}": ran.append(name))
        for kind in ("frame_blocks", "global_blocks")
        for i, block in enumerate(getattr(model, kind))
    ]
    try:
        model.window_features(long_windows, layer=0)
    finally:
        for hook in hooks:
            hook.remove()
    assert "frame_blocks.0" in ran and "global_blocks.0" in ran
    assert "frame_blocks.1" not in ran and "global_blocks.1" not in ran


def test_out_of_range_layer_and_bad_options_are_rejected(model: VGGTAggregator, window: torch.Tensor) -> None:
    with pytest.raises(IndexError, match="layer 2"):
        model.window_features(window, layer=2)
    with pytest.raises(ValueError, match="reference_frame"):
        model.window_features(window, reference_frame="middle")  # type: ignore[arg-type]


def test_malformed_images_get_a_clear_error(model: VGGTAggregator, window: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"\[B, S, 3, H, W\]"):
        model(window[0])
    with pytest.raises(ValueError, match="multiple of the patch size 14"):
        model(window[..., :80, :])
    with pytest.raises(ValueError, match="float"):
        model((window * 255).to(torch.uint8))


# ------------------------------------------------------------------------ frozen encoder


def test_aggregator_is_frozen_and_stays_in_eval_mode(model: VGGTAggregator) -> None:
    assert not any(p.requires_grad for p in model.parameters())
    model.train()
    assert not model.training and not any(m.training for m in model.modules())
    assert "_resnet_mean" not in model.state_dict() and "_resnet_std" not in model.state_dict()


def test_window_features_can_feed_a_trainable_module(model: VGGTAggregator, window: torch.Tensor) -> None:
    """Features come out of inference mode as ordinary tensors, so a merger can train on them."""
    features = model.window_features(window)
    assert not features.requires_grad and not features.is_inference()
    head = torch.nn.Linear(features.shape[-1], 1)
    head(features).sum().backward()
    assert head.weight.grad is not None


def test_forward_traces_as_one_graph_for_torch_compile(model: VGGTAggregator, window: torch.Tensor) -> None:
    """No data-dependent Python control flow: dynamo captures the whole encode without breaks."""
    torch._dynamo.reset()
    compiled = torch.compile(model.window_features, backend="eager", fullgraph=True)
    assert torch.equal(compiled(window), model.window_features(window))


# --------------------------------------------------------------------- VGGT-1B structure


def test_vggt1b_defaults_give_exactly_the_checkpoint_keys_and_shapes() -> None:
    with torch.device("meta"):
        aggregator = VGGTAggregator()
    expected = json.loads((GOLDEN_DIR / "vggt1b_aggregator_keys.json").read_text())
    state = aggregator.state_dict()
    assert list(state) == list(expected)
    assert {key: list(value.shape) for key, value in state.items()} == expected
    assert sum(value.numel() for value in state.values()) == 909_112_320


def test_golden_config_section_is_exactly_the_constructor_keywords() -> None:
    config = json.loads((GOLDEN_DIR / "config.json").read_text())
    for section in ("aggregator", "vggt_1b_defaults"):
        with torch.device("meta"):
            aggregator = VGGTAggregator(**config[section])
        assert aggregator.config == AggregatorConfig.from_dict(config[section])
    assert AggregatorConfig.from_dict(config["vggt_1b_defaults"]) == AggregatorConfig()


def test_invalid_configs_are_rejected_with_the_reason() -> None:
    with pytest.raises(ValueError, match="attention"):
        AggregatorConfig(attention="bidirectional")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="patch_embed.embed_dim"):
        AggregatorConfig.from_dict(tiny_config(patch_embed={"embed_dim": 64}))
    with pytest.raises(ValueError, match="unknown aggregator config key"):
        AggregatorConfig.from_dict(tiny_config(aa_order=["frame", "global"]))


def test_window_cost_matches_the_analytic_vggt1b_figures() -> None:
    """≈62.5 TFLOP per 9-frame 644² window block-causal, ≈78.4 full, ≈60.5 stopping at layer -2."""
    config = AggregatorConfig()
    assert window_flops(config, 644, 644, 9) / 1e12 == pytest.approx(62.5, abs=0.1)
    assert window_flops(config, 644, 644, 9, attention="full") / 1e12 == pytest.approx(78.4, abs=0.1)
    assert window_flops(config, 644, 644, 9, last_layer=-2) / 1e12 == pytest.approx(60.5, abs=0.1)
