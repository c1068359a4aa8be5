"""Qwen3-VL as a second base, on the tiny Qwen3-VL (configs/models/tiny-qwen3_vl, built offline by
tools/tiny_model.py): the base is read from the checkpoint's config; its facts equal transformers'
own; pixel values from stored uint8 frames equal its image processor bit for bit; the prompt equals
its chat template token for token; janus's fused forward is the plain Qwen3-VL forward at lam = 0
and, at lam > 0, adds each sample's 3-D term exactly at that sample's image positions, DeepStack
kept as the base does it.

Qwen3-VL frames are 64x64 (2x2 visual tokens of 32 px); their VGGT features come from the same
source images at pad56 (4x4 VGGT patches, grouped 2x2 into the same 2x2 token grid: the grid rule
of janus_core.bases).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures, Qwen3VLModel

from helpers.model_cases import FEATURE_DIM, MERGER_HIDDEN, tiny_encoder, window_frames
from janus_core.bases import (
    BASES,
    QWEN2_5_VL,
    QWEN3_VL,
    BaseError,
    base_of_qwen_dir,
)
from janus_core.imaging import load_frame, load_qwen_frame, qwen_pixel_values
from janus_core.index import DatasetIndex, Sample
from janus_core.profile import LanguageModelSettings, load_profile
from janus_core.resolution import Resolution
from janus_train.data.prompt import IGNORE_INDEX, PromptBuilder
from janus_train.data.samples import TrainItem, collate
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, ModelInputError, load_qwen, part_of
from janus_train.model.loss import LossConfig, LossDenominators, micro_batch_loss
from janus_train.data.rope import RopeIndex
from tools.tiny_model import QWEN_DIR_FILES, write_tiny_qwen_dir

REPO = Path(__file__).resolve().parents[2]
QWEN3_DIR = REPO / "configs" / "models" / "tiny-qwen3_vl"
QWEN25_DIR = REPO / "configs" / "models" / "tiny-qwen2_5_vl"
SIDE = 64  # Qwen3-VL frame side: 4x4 patches of 16 px, 2x2 visual tokens
TOKENS = 4


@cache
def tokenizer():
    return AutoTokenizer.from_pretrained(QWEN3_DIR)


@cache
def builder() -> PromptBuilder:
    return PromptBuilder(tokenizer(), TOKENS)


def qwen3_frame(path: Path) -> np.ndarray:
    """The 64x64 Qwen3-VL frame of a source image paired with its VGGT frame at pad56."""
    return load_qwen_frame(path, "pad56", QWEN3_VL)


def tiny_qwen3_model(lam: float) -> JanusVLNModel:
    qwen = load_qwen(LanguageModelSettings(path=QWEN3_DIR, random_init=True, seed=0))
    return JanusVLNModel(qwen, FEATURE_DIM, JanusModelConfig(lam=lam, merger_hidden=MERGER_HIDDEN)).eval()


def qwen3_batch(index: DatasetIndex, samples: list[Sample]) -> dict[str, torch.Tensor]:
    """A micro-batch of real samples: prompt tensors, 64x64 Qwen3-VL frames and the tiny VGGT's
    features of the same source images at pad56."""
    batch = builder().collate([builder().build_sample(s) for s in samples])
    batch["frames"] = torch.stack([
        torch.from_numpy(np.stack([qwen3_frame(frame.path) for frame in index.window(s)])) for s in samples])
    batch["features"] = tiny_encoder().encode(torch.stack([window_frames(index, s) for s in samples]))
    return batch


@pytest.fixture(scope="module")
def pair(sample_index: DatasetIndex) -> list[Sample]:
    """Two samples from different episodes: different texts, windows and features."""
    return [sample_index.samples[3], sample_index.samples[12 + 10]]


@pytest.fixture(scope="module")
def pair_batch(sample_index: DatasetIndex, pair: list[Sample]) -> dict[str, torch.Tensor]:
    return qwen3_batch(sample_index, pair)


# ------------------------------------------------------------------------------- the base


def test_the_base_is_the_checkpoint_configs_model_type(tmp_path: Path) -> None:
    assert base_of_qwen_dir(QWEN25_DIR) is QWEN2_5_VL
    assert base_of_qwen_dir(QWEN3_DIR) is QWEN3_VL
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(BaseError) as err:
        base_of_qwen_dir(tmp_path)
    assert str(err.value) == (f"{tmp_path / 'config.json'}: model_type 'llava' is not a base janus supports; "
                              "expected one of qwen2_5_vl (Qwen2.5-VL), qwen3_vl (Qwen3-VL)")
    with pytest.raises(BaseError, match=r"no such file; 'qwen.path' must be a Qwen2.5-VL or Qwen3-VL directory"):
        base_of_qwen_dir(tmp_path / "missing")


@pytest.mark.parametrize("qwen_dir", [QWEN25_DIR, QWEN3_DIR], ids=["qwen2_5_vl", "qwen3_vl"])
def test_each_bases_facts_are_transformers_own(qwen_dir: Path) -> None:
    base = base_of_qwen_dir(qwen_dir)
    config = AutoConfig.from_pretrained(qwen_dir)
    vision = config.vision_config
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (
        base.patch_size, base.merge_size, base.temporal_patch)
    processor = AutoImageProcessor.from_pretrained(qwen_dir)
    assert (processor.patch_size, processor.merge_size, processor.temporal_patch_size) == (
        base.patch_size, base.merge_size, base.temporal_patch)
    assert tuple(processor.image_mean) == base.image_mean and tuple(processor.image_std) == base.image_std
    assert base.transformers_class().config_class.model_type == base.model_type == config.model_type
    assert base.transformers_class("inner").get_rope_index is not None
    assert isinstance(base.transformers_class("vision")(vision), torch.nn.Module)
    assert hasattr(vision, "deepstack_visual_indexes") == base.deepstack


def test_the_tool_reproduces_the_committed_tiny_qwen3_directory_byte_for_byte(tmp_path: Path) -> None:
    """Built offline from code: same tokenizer as the tiny Qwen2.5-VL, Qwen3-VL's template and config."""
    written = write_tiny_qwen_dir(tmp_path, base=QWEN3_VL)
    assert sorted(p.name for p in written) == sorted(p.name for p in QWEN3_DIR.iterdir()) == sorted(QWEN_DIR_FILES)
    for path in written:
        assert path.read_bytes() == (QWEN3_DIR / path.name).read_bytes(), (
            f"{path.name} differs; regenerate with: python -m tools.tiny_model configs/models/tiny-qwen3_vl "
            "--base qwen3_vl")
    assert (QWEN3_DIR / "tokenizer.json").read_bytes() == (QWEN25_DIR / "tokenizer.json").read_bytes()
    config = AutoConfig.from_pretrained(QWEN3_DIR)
    assert list(config.vision_config.deepstack_visual_indexes) == [0, 1]
    assert config.text_config.num_hidden_layers == 3  # DeepStack's two layers both reach the loss


def test_qwen3_vl_facts_are_the_defaults_of_its_transformers_config() -> None:
    """16-px patches, 2x2 merge (32 px per token), 2 frames per patch, DeepStack."""
    defaults = Qwen3VLVisionConfig()
    assert (defaults.patch_size, defaults.spatial_merge_size, defaults.temporal_patch_size) == (16, 2, 2)
    assert (QWEN3_VL.patch_size, QWEN3_VL.merge_size, QWEN3_VL.temporal_patch, QWEN3_VL.token_pixels) == (16, 2, 2, 32)
    assert QWEN3_VL.patch_dim == 3 * 2 * 16 * 16 and QWEN3_VL.image_mean == QWEN3_VL.image_std == (0.5, 0.5, 0.5)
    assert list(defaults.deepstack_visual_indexes) == [8, 16, 24] and QWEN3_VL.deepstack
    assert set(BASES) == {"qwen2_5_vl", "qwen3_vl"}


def test_the_8b_architecture_is_stored_as_shapes_only() -> None:
    """configs/models/qwen3_vl_8b: Qwen3-VL-8B-Instruct's config (no weights) for the FLOP count."""
    directory = REPO / "configs" / "models" / "qwen3_vl_8b"
    assert sorted(p.name for p in directory.iterdir()) == ["config.json"]
    config = AutoConfig.from_pretrained(directory)
    assert isinstance(config, Qwen3VLConfig) and base_of_qwen_dir(directory) is QWEN3_VL
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        4096, 36, 32, 8)
    assert (vision.depth, vision.hidden_size, vision.out_hidden_size) == (27, 1152, 4096)
    assert list(vision.deepstack_visual_indexes) == [8, 16, 24]


# --------------------------------------------------------------------------------- the grids


def test_vggt_runs_at_its_own_resolution_whose_grouped_grid_is_qwen3s_token_grid() -> None:
    """The grid rule: Qwen3-VL at pad{T}, VGGT at pad{T*14/16}; both grids T/16 patches a side."""
    assert QWEN3_VL.vggt_side(640) == 560 and QWEN3_VL.vggt_side(SIDE) == 56
    assert QWEN3_VL.token_grid(640, 640) == (20, 20)
    assert QWEN3_VL.vggt_grid(640, 640) == Resolution.parse("pad560").patch_grid() == (40, 40)
    assert QWEN3_VL.vggt_grid(SIDE, SIDE) == Resolution.parse("pad56").patch_grid() == (4, 4)
    assert QWEN3_VL.token_grid(96, 128) == (3, 4) and QWEN3_VL.vggt_grid(96, 128) == (6, 8)
    # Qwen2.5-VL shares VGGT's 14-px patches: one resolution for both models.
    assert QWEN2_5_VL.vggt_side(644) == 644 and QWEN2_5_VL.vggt_grid(644, 644) == (46, 46)
    with pytest.raises(ValueError, match="a Qwen3-VL frame side must be a positive multiple of 32 px, got 644"):
        QWEN3_VL.vggt_side(644)
    with pytest.raises(ValueError, match=r"frame size 56x56 \(HxW\) is not whole Qwen3-VL visual tokens"):
        QWEN3_VL.patch_grid(56, 56)


def test_a_qwen3_frame_covers_the_source_as_its_vggt_frame_does_patch_for_patch() -> None:
    """Pad and crop, landscape and portrait: the same preprocessing with every side counted in
    16-px instead of 14-px patches, so white padding and content span the same patches."""
    for size, resolution in (((640, 480), "pad56"), ((480, 640), "pad560"), ((640, 480), "crop224"),
                             ((641, 479), "pad644")):
        rng = np.random.default_rng(size[0])
        source = Image.fromarray(rng.integers(0, 250, (size[1], size[0], 3), dtype=np.uint8))  # never white
        vggt, qwen = load_frame(source, resolution), load_qwen_frame(source, resolution, QWEN3_VL)
        assert qwen.dtype == np.uint8 and qwen.shape == (vggt.shape[0] // 14 * 16, vggt.shape[1] // 14 * 16, 3)
        for axis in (0, 1):
            white_v = (vggt == 255).all(axis=(1 - axis, 2))
            white_q = (qwen == 255).all(axis=(1 - axis, 2))
            assert int(white_v.sum()) / 14 == int(white_q.sum()) / 16
            assert int(np.argmin(white_v)) / 14 == int(np.argmin(white_q)) / 16  # first content row/column
    assert load_qwen_frame(source, "pad56", QWEN2_5_VL).tobytes() == load_frame(source, "pad56").tobytes()
    assert QWEN3_VL.token_grid(*load_qwen_frame(source, "pad644", QWEN3_VL).shape[:2]) == (23, 23)


# ------------------------------------------------------------------------------ pixel values


def test_pixel_values_from_stored_frames_equal_qwen3_vls_processor_on_the_same_pngs(
    sample_index: DatasetIndex, tmp_path: Path,
) -> None:
    """Stored uint8 frames (PNG files) -> janus's lookup-table path, against the tiny Qwen3-VL's
    own image processor on the same PNGs (uint8, default rescaling) and on the live [0, 1] float
    tensor with rescaling off: bit for bit. A noise frame hits every uint8 value of every channel;
    a 96x128 frame (3x4 tokens) pins the row/column order."""
    rng = np.random.default_rng(0)
    frames = [qwen3_frame(frame.path) for frame in sample_index.window(sample_index.samples[5])]
    frames.append(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8))
    processor = AutoImageProcessor.from_pretrained(QWEN3_DIR)
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


# ------------------------------------------------------------------------------------ prompt


def test_token_sequence_and_label_mask_equal_qwen3_vls_chat_template(sample_index: DatasetIndex) -> None:
    """The conversation through the base's own chat template, each image pad repeated to the
    frame's visual tokens as its processor does; supervised = everything after the template's
    generation prompt (the assistant header)."""
    for sample in (sample_index.samples[0], sample_index.samples[17]):
        encoded = builder().build_sample(sample)
        text = builder().sample_texts(sample)
        user: list[dict] = []
        for piece in text.user.split("<image>"):
            if user:
                user.append({"type": "image"})
            if piece:
                user.append({"type": "text", "text": piece})
        messages = [{"role": "system", "content": builder().template.system},
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": text.target}]
        pads = "<|image_pad|>" * TOKENS
        whole = tokenizer().apply_chat_template(messages, tokenize=False).replace("<|image_pad|>", pads)
        prompt = tokenizer().apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
        prompt = prompt.replace("<|image_pad|>", pads)
        ids = tokenizer()(whole, add_special_tokens=False)["input_ids"]
        n_prompt = len(tokenizer()(prompt, add_special_tokens=False)["input_ids"])
        assert encoded.input_ids.tolist() == ids
        assert (encoded.labels != IGNORE_INDEX).tolist() == [i >= n_prompt for i in range(len(ids))]
        assert encoded.labels[n_prompt:].tolist() == ids[n_prompt:]
    # Qwen3-VL's template adds no default system turn (janus's prompts always carry one).
    bare = [{"role": "user", "content": "hi"}]
    assert tokenizer().apply_chat_template(bare, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"


# ------------------------------------------------------------------------------------- model


def test_rope_positions_are_qwen3_vls_own(pair_batch: dict[str, torch.Tensor]) -> None:
    model = tiny_qwen3_model(lam=0.0)
    grid_thw = torch.tensor([[1, 4, 4]]).expand(2 * 9, 3)
    own, _ = model.qwen.model.get_rope_index(pair_batch["input_ids"], pair_batch["mm_token_type_ids"],
                                             image_grid_thw=grid_thw, attention_mask=pair_batch["attention_mask"])
    ours = RopeIndex(model.qwen.config)(pair_batch["input_ids"], pair_batch["mm_token_type_ids"],
                                        pair_batch["attention_mask"], (4, 4), 9)
    assert isinstance(model.qwen.model, Qwen3VLModel) and torch.equal(ours, own)


def test_the_loader_builds_qwen3_vls_positions_for_its_frames(sample_index: DatasetIndex, pair: list[Sample],
                                                              pair_batch: dict[str, torch.Tensor]) -> None:
    """The loader workers' collate gives a batch of 64x64 Qwen3-VL frames the ids the base's own
    get_rope_index gives its 4x4 patch grid (not VGGT's or Qwen2.5-VL's 14-px grid)."""
    items = [TrainItem(s.key, builder().build_sample(s), pair_batch["frames"][i], pair_batch["features"][i])
             for i, s in enumerate(pair)]
    config = AutoConfig.from_pretrained(QWEN3_DIR)
    batch = collate(items, tokenizer().pad_token_id, RopeIndex(config))
    own, _ = Qwen3VLModel.get_rope_index(
        type("ConfigOnly", (), {"config": config, "get_vision_position_ids": Qwen3VLModel.get_vision_position_ids})(),
        batch["input_ids"], batch["mm_token_type_ids"], image_grid_thw=torch.tensor([[1, 4, 4]]).expand(18, 3),
        attention_mask=batch["attention_mask"])
    assert RopeIndex(config).patch_grid(SIDE, SIDE) == (4, 4) and torch.equal(batch["position_ids"], own)


def test_fused_forward_at_lam_0_is_the_plain_qwen3_vl_forward(pair_batch: dict[str, torch.Tensor]) -> None:
    model = tiny_qwen3_model(lam=0.0)
    assert isinstance(model.qwen, Qwen3VLForConditionalGeneration)
    with torch.no_grad():
        ours = model.qwen.lm_head(model(pair_batch, return_hidden=True).hidden_states)
        pixel_values, grid_thw = qwen_pixel_values(pair_batch["frames"].flatten(0, 1), base=QWEN3_VL)
        plain = model.qwen(input_ids=pair_batch["input_ids"], attention_mask=pair_batch["attention_mask"],
                           mm_token_type_ids=pair_batch["mm_token_type_ids"], pixel_values=pixel_values,
                           image_grid_thw=grid_thw).logits
    valid = pair_batch["attention_mask"].bool()
    torch.testing.assert_close(ours[valid], plain[valid], rtol=0, atol=1e-6)


def _language_model_inputs(model: JanusVLNModel, batch: dict[str, torch.Tensor]) -> dict:
    seen: dict = {}

    def hook(_module, _args, kwargs):
        seen.update(kwargs)

    handle = model.qwen.model.language_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(batch)
    finally:
        handle.remove()
    return seen


def test_the_3d_term_reaches_exactly_its_own_samples_visual_positions_deepstack_kept(
    pair_batch: dict[str, torch.Tensor],
) -> None:
    """Micro-batch of 2. The LLM's input embeddings at lam = 0.5 differ from those at lam = 0
    exactly at the image pads, by 0.5 x merger(that sample's feature) on each of its 9 images;
    changing sample 1's feature changes sample 1's image pads only. The DeepStack inputs are the
    base's own (its ViT's deepstack features at the image pads) whatever lam. And transformers'
    Qwen3-VL forward fed these fused embeddings as its encoder output gives janus's logits."""
    plain, fused = tiny_qwen3_model(lam=0.0), tiny_qwen3_model(lam=0.5)
    fused.vggt_merger.load_state_dict(plain.vggt_merger.state_dict())
    base_in, fused_in = _language_model_inputs(plain, pair_batch), _language_model_inputs(fused, pair_batch)
    pads = pair_batch["input_ids"] == fused.image_token_id
    delta = fused_in["inputs_embeds"] - base_in["inputs_embeds"]
    assert bool((delta[~pads] == 0).all()) and bool((delta[pads].abs().sum(-1) > 0).all())
    with torch.no_grad():
        merged = fused.vggt_merger(pair_batch["features"].float(), (4, 4))  # [2, 4 tokens, hidden]
    for row in range(2):
        expected = (0.5 * merged[row]).repeat(9, 1)
        torch.testing.assert_close(delta[row][pads[row]], expected, rtol=1e-5, atol=1e-6)

    features = pair_batch["features"].clone()
    features[1] = features[1].flip(0)
    other_in = _language_model_inputs(fused, dict(pair_batch, features=features))
    changed = (other_in["inputs_embeds"] != fused_in["inputs_embeds"]).any(-1)
    assert torch.equal(changed[0], torch.zeros_like(changed[0])) and torch.equal(changed[1], pads[1])

    pixel_values, grid_thw = qwen_pixel_values(pair_batch["frames"].flatten(0, 1), base=QWEN3_VL)
    with torch.no_grad():
        own = fused.qwen.model.get_image_features(pixel_values, grid_thw)
    assert torch.equal(fused_in["visual_pos_masks"], pads)
    assert len(fused_in["deepstack_visual_embeds"]) == 2
    for ours, base_plain, theirs in zip(fused_in["deepstack_visual_embeds"], base_in["deepstack_visual_embeds"],
                                        own.deepstack_features, strict=True):
        assert torch.equal(ours, base_plain) and torch.equal(ours, torch.cat(theirs))

    with torch.no_grad():
        ours_logits = fused.qwen.lm_head(fused(pair_batch, return_hidden=True).hidden_states)
        injected = tuple(fused.image_embeddings(pair_batch["frames"], pair_batch["features"]).flatten(0, 1))
        theirs_logits = fused.qwen(
            input_ids=pair_batch["input_ids"], attention_mask=pair_batch["attention_mask"],
            mm_token_type_ids=pair_batch["mm_token_type_ids"], image_grid_thw=grid_thw,
            mm_encoder_outputs={"image": BaseModelOutputWithDeepstackFeatures(
                pooler_output=injected, deepstack_features=own.deepstack_features)},
        ).logits
    valid = pair_batch["attention_mask"].bool()
    torch.testing.assert_close(ours_logits[valid], theirs_logits[valid], rtol=0, atol=1e-6)


def test_backward_reaches_the_projectors_deepstack_mergers_included_and_not_the_frozen_vit(
    pair_batch: dict[str, torch.Tensor],
) -> None:
    """Default trainable parts: the LLM, both ViT mergers (main and DeepStack: the projector), the
    VGGT merger and the action head get gradients; the ViT's patch embedding, learned position
    embeddings and blocks none."""
    model = tiny_qwen3_model(lam=0.2).train()
    parts = {name: part_of(name) for name, _ in model.named_parameters()}
    assert {n for n, part in parts.items() if "deepstack_merger_list" in n and part != "projector"} == set()
    assert any(n.startswith("qwen.model.visual.pos_embed.") and part == "vision_tower" for n, part in parts.items())
    den = LossDenominators.from_batches([pair_batch])
    micro_batch_loss(model(pair_batch).loss_parts, den, LossConfig(distill_loss_weight=1.0), 0).backward()
    touched = {part: False for part in ("language_model", "projector", "vggt_merger", "action_head")}
    for name, param in model.named_parameters():
        if parts[name] == "vision_tower":
            assert param.grad is None, name
        elif param.grad is not None and param.grad.abs().sum() > 0:
            touched[parts[name]] = True
    assert all(touched.values()), touched
    deepstack = {n: p.grad for n, p in model.named_parameters() if "deepstack_merger_list" in n}
    assert deepstack and [n for n, g in deepstack.items() if g is None or not g.abs().sum() > 0] == []


def test_a_profile_whose_qwen_path_is_a_qwen3_vl_directory_builds_the_qwen3_vl_model(
    tmp_path: Path, pair_batch: dict[str, torch.Tensor],
) -> None:
    """The base follows qwen.path alone; the live VGGT is refused in one line for a batch with
    neither cached features nor VGGT's own frames (it never runs on Qwen3-VL's)."""
    import yaml

    from helpers.profiles import write_test_profile

    path = write_test_profile(tmp_path / "qwen3.yaml")
    data = yaml.safe_load(path.read_text())
    data["qwen"]["path"] = str(QWEN3_DIR)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    profile = load_profile(path)
    model = JanusVLNModel.from_profile(profile, JanusModelConfig(lam=0.2, merger_hidden=MERGER_HIDDEN)).eval()
    assert model.base is QWEN3_VL and isinstance(model.qwen, Qwen3VLForConditionalGeneration)
    with torch.no_grad():
        assert torch.isfinite(model(pair_batch).loss_parts.segment_ce_sum).all()
    live = JanusVLNModel.from_profile(profile, JanusModelConfig(merger_hidden=MERGER_HIDDEN), live=True)
    with pytest.raises(ModelInputError, match=r"^a live Qwen3-VL batch needs 'vggt_frames' \(VGGT's frames of the "
                                              r"same sources, janus_train\.data\.samples\.LiveFrames\): VGGT does not run on "
                                              r"Qwen3-VL's frames$"):
        live({k: v for k, v in pair_batch.items() if k != "features"})


def test_the_reference_layout_export_refuses_a_qwen3_vl_run_in_one_line(tmp_path: Path) -> None:
    """--format janusvln is JanusVLN's Qwen2.5-VL layout; a Qwen3-VL run is refused before any
    checkpoint is read, nothing written."""
    import yaml

    from helpers.profiles import write_test_profile
    from janus_train.checkpoint.export import export_janusvln
    from janus_train.config import load_train_settings

    path = write_test_profile(tmp_path / "qwen3.yaml")
    data = yaml.safe_load(path.read_text())
    data["qwen"]["path"] = str(QWEN3_DIR)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    profile = load_profile(path)
    out = tmp_path / "export"
    with pytest.raises(ValueError) as err:
        export_janusvln(tmp_path / "checkpoints", out, profile, load_train_settings(profile), None)
    assert str(err.value) == (
        f"--format janusvln writes JanusVLN's reference checkpoint layout, which is Qwen2.5-VL only, but this run's "
        f"base ({QWEN3_DIR}) is Qwen3-VL; export it with --format janus")
    assert not out.exists()


def test_features_off_the_qwen3_grid_are_one_line(pair_batch: dict[str, torch.Tensor]) -> None:
    model = tiny_qwen3_model(lam=0.2)
    with pytest.raises(ModelInputError, match=r"features have shape \(2, 4, 128\), expected \[2, 16, 128\] "
                                              r"\(batch, 4x4 VGGT patches"):
        model(dict(pair_batch, features=pair_batch["features"][:, :4]))


# ------------------------------------------------------------------------- one place per base

# Modules that still import a base's transformers classes themselves, each Qwen2.5-VL only for a
# reason; the rest of janus reaches a base through janus_core.bases. A new module that imports
# them fails here.
QWEN2_5_ONLY: dict[str, str] = {
    "janus_train/checkpoint/export.py": "--format janusvln writes JanusVLN's reference config, Qwen2.5-VL's by definition",
    "janus_train/checkpoint/reference.py": "JanusVLN's reference checkpoint layout is Qwen2.5-VL's by definition",
    "janus_train/model/janus_model.py": "JanusVLN's VGGT merger normalises with Qwen2.5-VL's RMSNorm, whatever the base",
}


def _imports_a_base_class(source: str) -> bool:
    import ast
    import re

    name = re.compile(r"^(Qwen2_5_VL|Qwen2_5_Vision|Qwen3VL)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if re.search(r"\bqwen(2_5|3)_vl\b", node.module or "") or any(name.match(a.name) for a in node.names):
                return True
        elif isinstance(node, ast.Import) and any(re.search(r"\bqwen(2_5|3)_vl\b", a.name) for a in node.names):
            return True
    return False


def test_only_the_bases_module_imports_a_bases_transformers_classes() -> None:
    importers = sorted(
        path.relative_to(REPO).as_posix()
        for directory in ("janus_core", "janus_cache", "janus_train", "pipelines", "benchmarks", "tools")
        for path in (REPO / directory).rglob("*.py")
        if _imports_a_base_class(path.read_text(encoding="utf-8"))
    )
    assert importers == sorted(QWEN2_5_ONLY), "import the base's classes through janus_core.bases.QwenBase"
