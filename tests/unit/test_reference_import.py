"""Checkpoints move both ways between janus and the reference JanusVLN trainer,
in one process: import, export, the refusals and the live-check parts.

A reference checkpoint directory is built by hand (helpers.reference, a session fixture), in the
layout the reference trainer saves (transformers 4.50): a flat Qwen2.5-VL ``config.json`` with the
JanusVLN fields and no ``text_config``, one ``model.safetensors`` with ``model.*``, ``lm_head.*``,
``visual.*``, ``merger.*``, ``action_head.{0,1,3}.*`` and ``vggt.aggregator.*``, and the tokenizer
files; at the tiny sizes (the tiny Qwen config, the tiny VGGT config), every tensor random. The
launches (a refused start, a 2-process run from the directory) are tests/e2e/test_reference_checkpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from helpers.model_cases import QWEN_DIR, VGGT_CONFIG, make_batch
from helpers.profiles import write_test_profile
from helpers.reference import (
    FEATURE_DIM,
    HIDDEN,
    LAM,
    MERGER_HIDDEN,
    RESOLUTION,
    damaged,
    reference_config,
    reference_shapes,
    vggt_head_shapes,
    write_reference_dir,
)
from janus_core.index import DatasetIndex
from janus_core.profile import CacheSettings, LanguageModelSettings, Profile, load_profile
from janus_core.resolution import Resolution
from janus_core.vggt import AggregatorConfig, VGGTAggregator
from janus_train.checkpoint.reference import (
    ReferenceCheckpointError,
    check_reference_checkpoint,
    load_reference_model,
    read_reference_config,
    reference_config_dict,
    reference_live_check,
    unused_heads_note,
    write_reference_checkpoint,
)
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, load_qwen
from janus_train.model.loss import LossConfig

DOCUMENTED_CONFIG_FIELDS = {
    "model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
    "bos_token_id", "eos_token_id", "vision_config", "lam", "reference_frame", "vggt_merger_hidden_dim",
    "distill_loss_weight", "distill_loss_weight_end", "distill_loss_weight_warmup_steps",
}


KEY_GROUPS = ("model.", "lm_head.", "visual.", "merger.", "action_head.", "vggt.aggregator.")


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    return load_profile(write_test_profile(tmp_path_factory.mktemp("profile") / "tiny.yaml",
                                           cache={"resolution": RESOLUTION}))


def as_reference(model: JanusVLNModel) -> dict[str, torch.Tensor]:
    """The model's state dict under the reference names, by the documented correspondence."""
    renames = (("qwen.model.language_model.", "model."), ("qwen.model.visual.", "visual."), ("qwen.lm_head.", "lm_head."),
               ("vggt_merger.norm.", "merger.ln_q."), ("vggt_merger.mlp.", "merger.mlp."),
               ("action_head.net.", "action_head."))
    out = {}
    for name, tensor in model.state_dict().items():
        prefix = next(p for p in renames if name.startswith(p[0]))
        out[prefix[1] + name.removeprefix(prefix[0])] = tensor
    return out


def outputs(model: JanusVLNModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model.eval()(batch, return_hidden=True)
    return {"segment_ce_sum": out.loss_parts.segment_ce_sum, "action_logits": out.action_logits,
            "hidden_states": out.hidden_states}


def test_import_takes_weights_lam_and_merger_width_from_the_directory(reference_dir: Path, profile: Profile) -> None:
    model = load_reference_model(reference_dir, profile, JanusModelConfig(lam=0.2, merger_hidden=128))
    assert model.config.lam == LAM and model.config.merger_hidden == MERGER_HIDDEN
    stored = load_file(reference_dir / "model.safetensors")
    ours = as_reference(model)
    assert set(ours) == {k for k in stored if not k.startswith("vggt.")}
    for key, tensor in ours.items():
        assert torch.equal(tensor, stored[key]), key


def test_import_reads_a_sharded_directory_through_its_index(reference_dir: Path, profile: Profile,
                                                            tmp_path: Path) -> None:
    """A 7B checkpoint comes as shards named by ``model.safetensors.index.json``."""
    state = load_file(reference_dir / "model.safetensors")
    sharded = write_reference_dir(tmp_path / "sharded", state)
    (sharded / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, shard_keys in shards.items():
        save_file({k: state[k] for k in shard_keys}, sharded / name, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, shard_keys in shards.items() for k in shard_keys}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    ours = as_reference(load_reference_model(sharded, profile, JanusModelConfig()))
    for key, tensor in ours.items():
        assert torch.equal(tensor, state[key]), key


def test_tied_lm_head_is_stored_once_as_the_embedding(reference_dir: Path, profile: Profile, tmp_path: Path) -> None:
    """Qwen2.5-VL-3B ties lm_head to the embeddings; transformers saves the matrix once."""
    state = load_file(reference_dir / "model.safetensors")
    del state["lm_head.weight"]
    tied = write_reference_dir(tmp_path / "tied", state, {**reference_config(), "tie_word_embeddings": True})
    model = load_reference_model(tied, profile, JanusModelConfig())
    assert model.qwen.lm_head.weight.data_ptr() == model.qwen.model.language_model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.qwen.lm_head.weight, state["model.embed_tokens.weight"])
    config = reference_config_dict(model.qwen.config, model.config, "last", LossConfig(), "float32")
    out = write_reference_checkpoint(tmp_path / "export", model.state_dict(), {}, config, QWEN_DIR, torch.float32)
    assert "lm_head.weight" not in load_file(out / "model.safetensors") and config["tie_word_embeddings"] is True


def test_config_of_the_directory_reads_as_a_transformers_5_config(reference_dir: Path) -> None:
    reference = read_reference_config(reference_dir)
    tiny = AutoConfig.from_pretrained(QWEN_DIR)
    assert reference.qwen.text_config.hidden_size == tiny.text_config.hidden_size
    assert reference.qwen.text_config.rope_parameters["mrope_section"] == tiny.text_config.rope_parameters["mrope_section"]
    assert reference.qwen.text_config.rope_parameters["rope_theta"] == tiny.text_config.rope_parameters["rope_theta"]
    assert reference.qwen.vision_config.out_hidden_size == tiny.vision_config.out_hidden_size
    assert reference.qwen.image_token_id == tiny.image_token_id
    assert (reference.lam, reference.reference_frame, reference.merger_hidden) == (LAM, "last", MERGER_HIDDEN)
    assert reference.distill == LossConfig(1.0, None, 0)


@pytest.mark.parametrize("drop", ["action_head.3.bias", "merger.ln_q.weight", "vggt.aggregator.camera_token"])
def test_a_missing_key_is_a_one_line_error_naming_it(reference_dir: Path, profile: Profile, tmp_path: Path,
                                                       drop: str) -> None:
    with pytest.raises(ReferenceCheckpointError) as err:
        load_reference_model(damaged(reference_dir, tmp_path, drop=drop), profile, JanusModelConfig())
    assert drop in str(err.value) and "missing" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("add", ["action_head.2.weight", "merger.extra.bias", "vggt.camera_head.trunk.0.weight"])
def test_an_unexpected_key_is_a_one_line_error_naming_it(reference_dir: Path, profile: Profile, tmp_path: Path,
                                                          add: str) -> None:
    with pytest.raises(ReferenceCheckpointError) as err:
        load_reference_model(damaged(reference_dir, tmp_path, add=add), profile, JanusModelConfig())
    assert add in str(err.value) and "unexpected" in str(err.value) and "\n" not in str(err.value)


def test_vggts_depth_and_point_heads_are_ignored_with_one_note(reference_dir: Path, reference_dir_with_heads: Path,
                                                              profile: Profile) -> None:
    """Every reference checkpoint keeps VGGT's depth and point heads (62 tensors each), unused by
    its forward: import, the encoder (``vggt.path`` / ``--vggt``) and verify's parts read past them
    and say so in one note line; the model is the one of the same directory without them."""
    heads = vggt_head_shapes()
    assert len(heads) == 124 and sum(key.startswith("vggt.depth_head.") for key in heads) == 62
    stored = load_file(reference_dir_with_heads / "model.safetensors")
    assert set(heads) <= set(stored)

    check_reference_checkpoint(reference_dir_with_heads, profile)
    with_heads = as_reference(load_reference_model(reference_dir_with_heads, profile, JanusModelConfig()))
    without = as_reference(load_reference_model(reference_dir, profile, JanusModelConfig()))
    assert set(with_heads) == set(without)
    for key, tensor in without.items():
        assert torch.equal(with_heads[key], tensor), key

    note = unused_heads_note(reference_dir_with_heads)
    assert note is not None and note.startswith("note: ") and "\n" not in note
    assert "124 tensors" in note and "vggt.depth_head.*" in note and "vggt.point_head.*" in note and "ignored" in note
    assert unused_heads_note(reference_dir) is None

    tiny_vggt = AggregatorConfig.from_dict(json.loads(VGGT_CONFIG.read_text()))
    encoder = VGGTAggregator.from_pretrained(reference_dir_with_heads, config=tiny_vggt)
    for key, tensor in encoder.state_dict().items():
        assert torch.equal(tensor, stored[f"vggt.aggregator.{key}"]), key
    cache = CacheSettings(resolution=Resolution.parse(RESOLUTION), reference_frame="last")
    window_encoder, fusion = reference_live_check(reference_dir_with_heads, cache, aggregator=tiny_vggt)
    assert fusion.lam == LAM and window_encoder.reference_frame == "last"


@pytest.mark.parametrize("add", ["vggt.track_head.trunk.0.weight", "vggt.camera_head.trunk.0.weight",
                                 "vggt.depth_head_v2.norm.weight", "depth_head.norm.weight"])
def test_beside_the_heads_any_other_unexpected_key_is_still_an_error(reference_dir_with_heads: Path,
                                                                     profile: Profile, tmp_path: Path,
                                                                     add: str) -> None:
    with pytest.raises(ReferenceCheckpointError) as err:
        check_reference_checkpoint(damaged(reference_dir_with_heads, tmp_path, add=add), profile)
    message = str(err.value)
    assert f"1 unexpected key: {add}" in message and "\n" not in message, message


def test_other_reference_frame_or_a_transformers_5_config_is_refused(reference_dir: Path, profile: Profile,
                                                                     tmp_path: Path) -> None:
    state = load_file(reference_dir / "model.safetensors")
    first = write_reference_dir(tmp_path / "first", state, reference_config("first"))
    with pytest.raises(ReferenceCheckpointError, match="reference_frame 'first'.*cache.reference_frame is 'last'"):
        check_reference_checkpoint(first, profile)
    modern = write_reference_dir(tmp_path / "v5", state, {**reference_config(), "text_config": {}})
    with pytest.raises(ReferenceCheckpointError, match="text_config"):
        check_reference_checkpoint(modern, profile)


def test_vggt_encoder_loads_from_the_reference_directory(reference_dir: Path) -> None:
    config = AggregatorConfig.from_dict(json.loads(VGGT_CONFIG.read_text()))
    model = VGGTAggregator.from_pretrained(reference_dir, config=config)
    stored = load_file(reference_dir / "model.safetensors")
    state = model.state_dict()
    assert set(state) == {k.removeprefix("vggt.aggregator.") for k in stored if k.startswith("vggt.aggregator.")}
    for key, tensor in state.items():
        assert torch.equal(tensor, stored[f"vggt.aggregator.{key}"]), key


def trained_like_model() -> JanusVLNModel:
    """A tiny model whose every weight differs from a fresh one (as after training)."""
    qwen = load_qwen(LanguageModelSettings(path=QWEN_DIR, random_init=True, seed=3))
    model = JanusVLNModel(qwen, FEATURE_DIM, JanusModelConfig(lam=LAM, merger_hidden=MERGER_HIDDEN))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    return model


def test_round_trip_export_then_import_gives_the_same_outputs(sample_index: DatasetIndex, profile: Profile,
                                                              tmp_path: Path) -> None:
    model = trained_like_model()
    encoder = VGGTAggregator.from_config(AggregatorConfig.from_dict(json.loads(VGGT_CONFIG.read_text())))
    config = reference_config_dict(model.qwen.config, model.config, "last", LossConfig(1.0), "float32")
    out = write_reference_checkpoint(tmp_path / "export", model.state_dict(), encoder.state_dict(), config, QWEN_DIR,
                                     torch.float32)
    imported = load_reference_model(out, profile, JanusModelConfig())
    batch = make_batch(sample_index, [sample_index.samples[3], sample_index.samples[20]])
    expected, got = outputs(model, batch), outputs(imported, batch)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


def test_exported_directory_has_exactly_the_documented_keys_and_config_fields(tmp_path: Path) -> None:
    model = trained_like_model()
    encoder = VGGTAggregator.from_config(AggregatorConfig.from_dict(json.loads(VGGT_CONFIG.read_text())))
    config = reference_config_dict(model.qwen.config, model.config, "last", LossConfig(0.5, 2.0, 100), "bfloat16")
    out = write_reference_checkpoint(tmp_path / "export", model.state_dict(), encoder.state_dict(), config, QWEN_DIR,
                                     torch.bfloat16)
    written = json.loads((out / "config.json").read_text())
    assert DOCUMENTED_CONFIG_FIELDS <= set(written) and "text_config" not in written
    assert written["architectures"] == ["Qwen2_5_VLForConditionalGenerationForJanusVLN"]
    assert written["model_type"] == "qwen2_5_vl" and written["rope_scaling"]["mrope_section"] == [2, 3, 3]
    assert (written["lam"], written["reference_frame"], written["vggt_merger_hidden_dim"]) == (LAM, "last", MERGER_HIDDEN)
    assert (written["distill_loss_weight"], written["distill_loss_weight_end"],
            written["distill_loss_weight_warmup_steps"]) == (0.5, 2.0, 100)
    assert written["hidden_size"] == HIDDEN and written["vision_config"]["out_hidden_size"] == HIDDEN
    stored = load_file(out / "model.safetensors")
    expected = set(reference_shapes()) - {k for k in reference_shapes() if k.startswith("merger.")}
    expected |= {"merger.ln_q.weight", "merger.mlp.0.weight", "merger.mlp.0.bias", "merger.mlp.2.weight",
                 "merger.mlp.2.bias"}
    assert set(stored) == expected
    assert all(key.startswith(KEY_GROUPS) for key in stored)
    assert {k.split(".")[1] for k in stored if k.startswith("action_head.")} == {"0", "1", "3"}
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                               "tokenizer_config.json", "preprocessor_config.json"}
    # janus reads it back (the reference trainer's own reader is transformers 4.50).
    assert read_reference_config(out).merger_hidden == MERGER_HIDDEN


def test_export_command_names_a_vggt_config_or_an_unknown_format(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.train_cli import app

    profile_path = write_test_profile(tmp_path / "p.yaml")  # the tiny profile: random VGGT, no vggt.path
    for args, words in ((["--format", "janusvln", "--vggt", str(VGGT_CONFIG)], "is an aggregator config, not a VGGT "
                         "checkpoint (model.safetensors or model.pt); leave --vggt out to include the profile's own"),
                        (["--format", "hf"], "--format must be one of")):
        result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "x"),
                                          "--profile", str(profile_path), *args])
        assert result.exit_code == 2 and words in result.output, result.output
        assert result.output.strip().count("\n") == 0


def test_live_check_parts_of_a_reference_directory(reference_dir: Path, profile: Profile,
                                                   sample_index: DatasetIndex) -> None:
    """The encoder is the directory's ``vggt.aggregator``; the fused embeddings are those the
    imported model computes from the same frames and features."""
    tiny_vggt = AggregatorConfig.from_dict(json.loads(VGGT_CONFIG.read_text()))
    cache = CacheSettings(resolution=Resolution.parse(RESOLUTION), reference_frame="last")
    encoder, fusion = reference_live_check(reference_dir, cache, aggregator=tiny_vggt)
    stored = load_file(reference_dir / "model.safetensors")
    for key, tensor in encoder.model.state_dict().items():
        assert torch.equal(tensor, stored[f"vggt.aggregator.{key}"]), key
    batch = make_batch(sample_index, [sample_index.samples[3], sample_index.samples[20]], with_features=False)
    features = encoder.encode(batch["frames"])
    model = load_reference_model(reference_dir, profile, JanusModelConfig())
    with torch.no_grad():
        expected = model.image_embeddings(batch["frames"], features)
    assert torch.equal(fusion.image_embeddings(batch["frames"], features), expected)
    assert encoder.reference_frame == "last" and fusion.lam == LAM
