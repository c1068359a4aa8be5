"""Loading VGGT checkpoints strictly, and the weights fingerprint the cache manifest keys on.

Every checkpoint here is written by the test itself (tiny config) into tmp_path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from helpers.vggt_golden_weights import GOLDEN_DIR, golden_state
from janus_core.vggt import CheckpointError, VGGTAggregator, load_aggregator_state_dict, weights_fingerprint


@pytest.fixture(scope="module")
def tiny_state() -> dict[str, torch.Tensor]:
    """Bare aggregator keys of the tiny golden model."""
    return golden_state()


@pytest.fixture(scope="module")
def tiny_config() -> dict[str, Any]:
    return json.loads((GOLDEN_DIR / "config.json").read_text())["aggregator"]


def full_vggt_state(aggregator: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full-model state dict: ``aggregator.*`` plus head tensors that must be ignored."""
    generator = torch.Generator().manual_seed(0)
    heads = {
        "depth_head.projects.0.weight": torch.randn(8, 4, generator=generator),
        "point_head.scratch.output_conv.bias": torch.randn(3, generator=generator),
        "camera_head.trunk.0.norm1.weight": torch.randn(16, generator=generator),
    }
    return {**{f"aggregator.{k}": v for k, v in aggregator.items()}, **heads}


def write_config(directory: Path, aggregator_section: dict[str, Any] | None) -> None:
    data: dict[str, Any] = {"img_size": 518, "patch_size": 14, "embed_dim": 1024}
    if aggregator_section is not None:
        data["aggregator"] = aggregator_section
    (directory / "config.json").write_text(json.dumps(data))


def assert_loaded(model: VGGTAggregator, expected: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert set(state) == set(expected)
    for key, value in expected.items():
        assert torch.equal(state[key], value), key
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    assert not model.training
    assert model._resnet_mean.device.type == "cpu"


# -------------------------------------------------------------------------------- formats


def test_loads_a_full_vggt_safetensors_directory_using_its_config_json(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    save_file(full_vggt_state(tiny_state), tmp_path / "model.safetensors")
    write_config(tmp_path, tiny_config)
    model = VGGTAggregator.from_pretrained(tmp_path)
    assert model.config.embed_dim == 128 and model.config.depth == 2
    assert_loaded(model, tiny_state)


def test_loads_a_torch_zip_checkpoint_with_bare_keys_and_an_explicit_config(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    torch.save(tiny_state, tmp_path / "model.pt")
    assert_loaded(VGGTAggregator.from_pretrained(tmp_path, config=tiny_config), tiny_state)


def test_loads_a_pth_file_given_directly_with_prefixed_keys_and_heads(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    path = tmp_path / "vggt_full.pth"
    torch.save(full_vggt_state(tiny_state), path)
    assert_loaded(VGGTAggregator.from_pretrained(path, config=tiny_config), tiny_state)


def test_bare_safetensors_file_and_torch_file_give_the_same_model(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    save_file(tiny_state, tmp_path / "bare.safetensors")
    torch.save(full_vggt_state(tiny_state), tmp_path / "model.pt")
    a = VGGTAggregator.from_pretrained(tmp_path / "bare.safetensors", config=tiny_config)
    b = VGGTAggregator.from_pretrained(tmp_path / "model.pt", config=tiny_config)
    frames = torch.rand(1, 2, 3, 28, 42, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.window_features(frames), b.window_features(frames))


def test_safetensors_is_preferred_when_a_directory_holds_both_formats(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    save_file(tiny_state, tmp_path / "model.safetensors")
    torch.save({"not_an_aggregator_key": torch.zeros(1)}, tmp_path / "model.pt")
    assert_loaded(VGGTAggregator.from_pretrained(tmp_path, config=tiny_config), tiny_state)


def test_config_json_without_an_aggregator_section_means_vggt1b(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor]
) -> None:
    """The tiny weights then fail strictly against the VGGT-1B shapes, naming the key."""
    save_file(full_vggt_state(tiny_state), tmp_path / "model.safetensors")
    write_config(tmp_path, None)
    with pytest.raises(CheckpointError, match=r"camera_token \(checkpoint \(1, 2, 1, 128\), model \(1, 2, 1, 1024\)\)"):
        VGGTAggregator.from_pretrained(tmp_path)


def reference_janusvln_state(aggregator: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A reference JanusVLN state dict: the encoder as ``vggt.aggregator.*`` next to Qwen weights,
    the VGGT merger and the action head, which must be ignored."""
    generator = torch.Generator().manual_seed(1)
    others = {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=generator),
        "lm_head.weight": torch.randn(16, 8, generator=generator),
        "visual.patch_embed.proj.weight": torch.randn(8, 3, 2, 2, 2, generator=generator),
        "merger.ln_q.weight": torch.randn(128, generator=generator),
        "action_head.3.bias": torch.randn(4, generator=generator),
    }
    return {**{f"vggt.aggregator.{k}": v for k, v in aggregator.items()}, **others}


def test_loads_the_encoder_of_a_reference_janusvln_checkpoint_directory(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    save_file(reference_janusvln_state(tiny_state), tmp_path / "model.safetensors")
    assert_loaded(VGGTAggregator.from_pretrained(tmp_path, config=tiny_config), tiny_state)


def test_reference_janusvln_checkpoint_is_read_strictly(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    state = reference_janusvln_state(tiny_state)
    del state["vggt.aggregator.global_blocks.0.attn.qkv.bias"]
    state["vggt.aggregator.frame_blocks.9.ls1.gamma"] = torch.ones(128)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        VGGTAggregator.from_pretrained(tmp_path, config=tiny_config)
    message = str(err.value)
    assert "1 missing key: global_blocks.0.attn.qkv.bias" in message
    assert "1 unexpected key: frame_blocks.9.ls1.gamma" in message and "\n" not in message


def test_loads_a_sharded_safetensors_checkpoint_through_its_index(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    """Big checkpoints (a 7B JanusVLN) come as shards named by ``model.safetensors.index.json``."""
    state = reference_janusvln_state(tiny_state)
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, shard_keys in shards.items():
        save_file({k: state[k] for k in shard_keys}, tmp_path / name)
    weight_map = {k: name for name, shard_keys in shards.items() for k in shard_keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert_loaded(VGGTAggregator.from_pretrained(tmp_path, config=tiny_config), tiny_state)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors is missing"):
        VGGTAggregator.from_pretrained(tmp_path, config=tiny_config)


# ----------------------------------------------------------------------------- strictness


def test_missing_key_is_an_error_naming_the_key(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    state = dict(tiny_state)
    del state["global_blocks.1.attn.k_norm.weight"]
    save_file(full_vggt_state(state), tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"1 missing key: global_blocks\.1\.attn\.k_norm\.weight") as err:
        VGGTAggregator.from_pretrained(tmp_path, config=tiny_config)
    assert str(tmp_path / "model.safetensors") in str(err.value)


def test_unexpected_aggregator_key_is_an_error_naming_the_key(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    state = {**tiny_state, "frame_blocks.2.norm1.weight": torch.ones(128)}
    torch.save(full_vggt_state(state), tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match=r"unexpected key: frame_blocks\.2\.norm1\.weight"):
        VGGTAggregator.from_pretrained(tmp_path, config=tiny_config)


def test_head_keys_without_the_aggregator_prefix_are_unexpected(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    """Without any ``aggregator.`` key the file is read as a bare aggregator: nothing is ignored."""
    save_file({**tiny_state, "depth_head.bias": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected key: depth_head\.bias"):
        VGGTAggregator.from_pretrained(tmp_path, config=tiny_config)


def test_shape_mismatch_is_an_error_naming_the_key(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    state = {**tiny_state, "patch_embed.pos_embed": torch.zeros(1, 1297, 128)}
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"shape mismatch.*patch_embed\.pos_embed \(checkpoint \(1, 1297, 128\)"):
        VGGTAggregator.from_pretrained(tmp_path, config=tiny_config)


def test_unreadable_or_absent_checkpoints_are_errors_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="looked for model.safetensors, model.pt, model.pth"):
        VGGTAggregator.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        VGGTAggregator.from_pretrained(tmp_path / "missing.safetensors")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match="unsupported checkpoint format"):
        VGGTAggregator.from_pretrained(tmp_path / "weights.bin")
    corrupt = tmp_path / "model.safetensors"
    corrupt.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=f"{corrupt}: cannot read checkpoint"):
        VGGTAggregator.from_pretrained(tmp_path)


def test_torch_checkpoint_holding_non_tensors_is_rejected(tmp_path: Path, tiny_state: dict[str, torch.Tensor]) -> None:
    torch.save({"model": tiny_state}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="entry 'model' is a dict, not a tensor"):
        load_aggregator_state_dict(tmp_path)


def test_invalid_aggregator_section_in_config_json_names_the_file(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    save_file(tiny_state, tmp_path / "model.safetensors")
    write_config(tmp_path, {**tiny_config, "heads": 3})
    with pytest.raises(CheckpointError, match=r"config\.json: invalid 'aggregator' section: unknown"):
        VGGTAggregator.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_independent_of_file_format_and_key_order(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], tiny_config: dict[str, Any]
) -> None:
    save_file(full_vggt_state(tiny_state), tmp_path / "full.safetensors")
    torch.save(dict(reversed(list(tiny_state.items()))), tmp_path / "bare.pt")
    from_safetensors = VGGTAggregator.from_pretrained(tmp_path / "full.safetensors", config=tiny_config)
    from_torch = VGGTAggregator.from_pretrained(tmp_path / "bare.pt", config=tiny_config)
    fingerprint = weights_fingerprint(from_safetensors)
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    assert weights_fingerprint(from_torch) == fingerprint
    assert weights_fingerprint(load_aggregator_state_dict(tmp_path / "bare.pt")) == fingerprint


def test_fingerprint_changes_with_any_value_dtype_or_name(tiny_state: dict[str, torch.Tensor]) -> None:
    base = weights_fingerprint(tiny_state)
    nudged = dict(tiny_state)
    nudged["global_blocks.1.ls2.gamma"] = nudged["global_blocks.1.ls2.gamma"].clone()
    nudged["global_blocks.1.ls2.gamma"][5] += 1e-7
    as_bf16 = {k: v.to(torch.bfloat16) for k, v in tiny_state.items()}
    renamed = {("aggregator." + k if k == "camera_token" else k): v for k, v in tiny_state.items()}
    fingerprints = {base, weights_fingerprint(nudged), weights_fingerprint(as_bf16), weights_fingerprint(renamed)}
    assert len(fingerprints) == 4


def test_fingerprint_refuses_unloaded_meta_weights() -> None:
    with torch.device("meta"):
        model = VGGTAggregator(embed_dim=64, depth=1, num_heads=2, patch_embed={"embed_dim": 64, "depth": 1, "num_heads": 2})
    with pytest.raises(ValueError, match="meta device"):
        weights_fingerprint(model)


def test_golden_weights_follow_the_documented_rule() -> None:
    """The regenerated weights reproduce the golden patch-embed output: the rule is the right one."""
    import numpy as np

    model = VGGTAggregator(**json.loads((GOLDEN_DIR / "config.json").read_text())["aggregator"])
    model.load_state_dict(golden_state(), strict=True)
    state = golden_state()
    assert state["patch_embed.blocks.0.ls1.gamma"].eq(0.1).all()
    assert len(state) == len(model.state_dict())
    inputs = torch.from_numpy(np.load(GOLDEN_DIR / "inputs.npy"))
    features = model.window_features(inputs, reference_frame="first", layer=-2)
    expected = torch.from_numpy(np.load(GOLDEN_DIR / "b_stream_first_feats.npy"))
    assert (features - expected).abs().max().item() <= 5e-5
