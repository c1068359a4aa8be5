"""The trainer's start-up check never builds the VGGT encoder: the encoder fingerprint of a
checkpoint is computed from the file, and equals the fingerprint of the module loaded from it.

The encoder here is VGGT-shaped (DINO patch embedding, frame and global blocks, registers, the
1B model's head size of 64) but narrower and shallower, so that a real cache can be precomputed
with it on a CPU in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from janus_cache.store import read_manifest
from janus_cache.verify import check_cache_for_training
from janus_core.profile import PROFILES_DIR
from janus_core.sample_data import write_sample_data
from janus_core.vggt import AggregatorConfig, VGGTAggregator
from janus_core.vggt.encoder import checkpoint_identity, encoder_fingerprint
from pipelines import precompute_run

MID_SIZE = {
    "img_size": 518, "patch_size": 14, "embed_dim": 256, "depth": 3, "num_heads": 4, "mlp_ratio": 4.0,
    "num_register_tokens": 4, "qkv_bias": True, "proj_bias": True, "ffn_bias": True, "qk_norm": True,
    "rope_freq": 100, "attention": "causal",
    "patch_embed": {"embed_dim": 256, "depth": 3, "num_heads": 4, "mlp_ratio": 4.0},
}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[VGGTAggregator, Path]:
    """A seeded random mid-size aggregator and its checkpoint directory: full-model keys (with
    a head the aggregator ignores) in model.safetensors, the same tensors in model.pt, config.json."""
    directory = tmp_path_factory.mktemp("mid-vggt")
    (directory / "config.json").write_text(json.dumps({"aggregator": MID_SIZE}))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = VGGTAggregator.from_config(MID_SIZE).eval()
    state = {f"aggregator.{k}": v.contiguous() for k, v in model.state_dict().items()}
    state["depth_head.proj.weight"] = torch.ones(4, 4)
    save_file(state, directory / "model.safetensors")
    torch.save(state, directory / "model.pt")
    return model, directory


def test_mid_size_config_is_vggt_shaped_and_bigger_than_tiny(encoder: tuple[VGGTAggregator, Path]) -> None:
    model, _ = encoder
    assert model.config == AggregatorConfig.from_dict(MID_SIZE)
    assert sum(p.numel() for p in model.parameters()) > 5_000_000


def test_a_checkpoint_file_fingerprints_as_the_module_loaded_from_it_in_either_format(
        encoder: tuple[VGGTAggregator, Path]) -> None:
    model, directory = encoder
    expected = encoder_fingerprint(model)
    for weights in (directory / "model.safetensors", directory / "model.pt", directory):
        identity = checkpoint_identity(weights)
        assert identity.fingerprint == expected, weights.name
        assert identity.fingerprint == encoder_fingerprint(VGGTAggregator.from_pretrained(weights))
        assert identity.config == model.config


def test_a_bf16_checkpoint_fingerprints_as_the_float32_module_loaded_from_it(
        encoder: tuple[VGGTAggregator, Path], tmp_path: Path) -> None:
    model, directory = encoder
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    save_file({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}, tmp_path / "model.safetensors")
    loaded = VGGTAggregator.from_pretrained(tmp_path)
    assert checkpoint_identity(tmp_path).fingerprint == encoder_fingerprint(loaded)
    assert checkpoint_identity(tmp_path).fingerprint != encoder_fingerprint(model)  # bf16 rounding changed weights


def test_the_training_gate_never_constructs_the_aggregator(
        encoder: tuple[VGGTAggregator, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, directory = encoder
    profile = yaml.safe_load((PROFILES_DIR / "tiny.yaml").read_text())
    profile.update(name="mid")
    profile["qwen"]["path"] = str((PROFILES_DIR / profile["qwen"]["path"]).resolve())
    profile["vggt"] = {"path": str(directory)}
    profile["cache"].update(resolution="pad112", history=1)
    profile_file = tmp_path / "mid.yaml"
    profile_file.write_text(yaml.safe_dump(profile))
    data = write_sample_data(tmp_path / "data", episodes=1, steps=3, seed=0)
    cache = tmp_path / "cache"
    assert precompute_run.run(precompute_run.Options(data, cache, profile=str(profile_file), workers=1)) == 0

    built: list[str] = []

    def refuse(self: VGGTAggregator, *args: object, **kwargs: object) -> None:
        built.append("VGGTAggregator.__init__")
        raise AssertionError("the training gate constructed the VGGT aggregator")

    monkeypatch.setattr(VGGTAggregator, "__init__", refuse)
    results = check_cache_for_training(cache, profile_file)
    assert [(r.name, r.status) for r in results] == [("schema", "pass"), ("integrity", "pass"), ("freshness", "pass")]
    assert built == []
    manifest = read_manifest(cache)
    assert manifest is not None and manifest.encoder_fingerprint == encoder_fingerprint(model)
