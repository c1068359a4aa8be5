"""The JanusVLN model on the tiny profile's Qwen2.5-VL and VGGT, and on the tiny Qwen3-VL where a
test takes the ``base`` fixture: merger order, per-sample injection (on Qwen3-VL with its DeepStack
inputs kept), the plain base at lam = 0, cached vs live features, logits only where supervised,
trainable sets and groups, batches that do not fit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from helpers.bases import QWEN3, BaseCase
from helpers.model_cases import (
    FEATURE_DIM,
    MERGER_HIDDEN,
    QWEN_DIR,
    VISUAL_TOKENS,
    make_batch,
    select,
    tiny_encoder,
    tiny_model,
)
from janus_core.bases import QWEN3_VL
from janus_core.imaging import qwen_pixel_lut, qwen_pixel_values
from janus_core.index import DatasetIndex, Sample
from janus_core.profile import LanguageModelSettings, load_profile
from janus_train.data.prompt import IGNORE_INDEX
from janus_train.model.janus_model import (
    ActionHead,
    JanusModelConfig,
    JanusVLNModel,
    ModelInputError,
    TrainableParts,
    VGGTMerger,
    attention_implementation,
    group_patches,
    load_qwen,
    part_of,
    vggt_feature_dim,
)
from janus_train.model.loss import LossConfig, LossDenominators, micro_batch_loss

TEXT_HIDDEN = 64  # the tiny Qwen's hidden size


@pytest.fixture(scope="module")
def two_samples(sample_index: DatasetIndex) -> list[Sample]:
    """Two samples from different episodes: different texts (lengths), windows and features."""
    return [sample_index.samples[3], sample_index.samples[12 + 10]]


@pytest.fixture(scope="module")
def pair_batch(sample_index: DatasetIndex, two_samples: list[Sample]) -> dict[str, torch.Tensor]:
    return make_batch(sample_index, two_samples)


@pytest.fixture(scope="module")
def base_pair_batch(base: BaseCase, sample_index: DatasetIndex, two_samples: list[Sample]) -> dict[str, torch.Tensor]:
    """The two samples on each base: its frames (Qwen3-VL's 64x64), VGGT's features."""
    return make_batch(sample_index, two_samples, base=base)


def supervised_count(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"] != IGNORE_INDEX).sum())


# ----------------------------------------------------------------------------------- merger


def test_merger_groups_patches_in_qwen_merge_order() -> None:
    """Each merged VGGT vector concatenates the same 4 patches, in the same order, as the 4
    consecutive pixel_values rows Qwen's ViT merger folds into one visual token."""
    gh, gw = 4, 6
    patch_id = torch.arange(gh * gw, dtype=torch.uint8).view(gh, gw) * 10  # distinct uint8 per patch
    frame = patch_id.repeat_interleave(14, 0).repeat_interleave(14, 1)[..., None].expand(-1, -1, 3)
    pixel_values, grid = qwen_pixel_values(frame[None].contiguous())
    assert grid.tolist() == [[1, gh, gw]]
    lut = qwen_pixel_lut()[0]
    # Every row of pixel_values is one patch; recover which one from its (constant) red value.
    row_patch = [int((lut == row[0]).nonzero()[0]) // 10 for row in pixel_values]
    qwen_tokens = [row_patch[4 * j : 4 * j + 4] for j in range(len(row_patch) // 4)]

    features = torch.arange(gh * gw, dtype=torch.float32).view(1, gh * gw, 1).expand(1, -1, 3)
    merged = group_patches(features, (gh, gw))
    assert merged.shape == (1, gh * gw // 4, 4 * 3)
    ours = [[int(v) for v in token.view(4, 3)[:, 0]] for token in merged[0]]
    assert ours == qwen_tokens
    assert ours[:2] == [[0, 1, 6, 7], [2, 3, 8, 9]]  # row-major blocks, row-major inside


def test_merger_crops_an_odd_patch_grid() -> None:
    features = torch.arange(5 * 7, dtype=torch.float32).view(1, 35, 1)
    merged = group_patches(features, (5, 7))
    cropped = features.view(5, 7)[:4, :6].reshape(1, 24, 1)
    torch.testing.assert_close(merged, group_patches(cropped, (4, 6)))
    with pytest.raises(ModelInputError, match="do not form a 4x4 grid"):
        group_patches(features, (4, 4))


def test_merger_and_action_head_layers() -> None:
    merger = VGGTMerger(feature_dim=FEATURE_DIM, out_dim=TEXT_HIDDEN, hidden_dim=MERGER_HIDDEN)
    assert merger.norm.variance_epsilon == 1e-6 and merger.norm.weight.shape == (FEATURE_DIM,)
    first, act, second = merger.mlp
    assert (first.in_features, first.out_features) == (4 * FEATURE_DIM, MERGER_HIDDEN)
    assert isinstance(act, torch.nn.GELU) and (second.in_features, second.out_features) == (MERGER_HIDDEN, TEXT_HIDDEN)
    assert merger(torch.randn(3, 16, FEATURE_DIM), (4, 4)).shape == (3, 4, TEXT_HIDDEN)
    # The real sizes: ~48 M parameters for VGGT-1B features into the 7B's 3584-wide embeddings.
    with torch.device("meta"):
        real = VGGTMerger(feature_dim=2048, out_dim=3584)
    assert sum(p.numel() for p in real.parameters()) == pytest.approx(48.2e6, rel=0.01)

    head = ActionHead(TEXT_HIDDEN)
    layers = list(head.net)
    assert [type(m).__name__ for m in layers] == ["Linear", "LayerNorm", "GELU", "Linear"]
    assert (layers[0].out_features, layers[-1].out_features) == (512, 4)


# -------------------------------------------------------------------------------- injection


def test_micro_batch_of_two_gives_each_sample_its_own_results(pair_batch: dict[str, torch.Tensor]) -> None:
    """Per-sample injection: a micro-batch of 2 equals each sample run alone, and each sample's
    results depend on its own feature only (a flat repeat of features would mix them)."""
    model = tiny_model().eval()
    with torch.no_grad():
        together = model(pair_batch, return_hidden=True)
        for row in range(2):
            alone = model(select(pair_batch, row), return_hidden=True)
            length = int(pair_batch["attention_mask"][row].sum())
            torch.testing.assert_close(
                together.hidden_states[row, :length], alone.hidden_states[0], rtol=1e-4, atol=1e-4
            )
            torch.testing.assert_close(
                together.loss_parts.segment_ce_sum[row], alone.loss_parts.segment_ce_sum[0], rtol=1e-5, atol=1e-4
            )
            torch.testing.assert_close(together.action_logits[row], alone.action_logits[0], rtol=1e-5, atol=1e-5)

        swapped = dict(pair_batch, features=pair_batch["features"].flip(0))
        other = model(swapped)
    # Each sample's answer loss changes when it gets the other sample's feature.
    differs = (other.loss_parts.segment_ce_sum - together.loss_parts.segment_ce_sum).abs().sum(1)
    assert (differs > 1e-3).all()


def test_injection_adds_lam_times_the_merged_feature_to_every_image_of_the_sample(
    pair_batch: dict[str, torch.Tensor],
) -> None:
    """Against transformers' own forward: image embeddings given as precomputed encoder outputs
    (Qwen ViT output + lam x merger(feature), tiled per sample by hand) give the same logits."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    model = tiny_model(lam=0.7).eval()
    with torch.no_grad():
        ours = model(pair_batch, return_hidden=True)
        frames = pair_batch["frames"]
        b, s = frames.shape[:2]
        pixel_values, grid_thw = qwen_pixel_values(frames.flatten(0, 1))
        vit = model.qwen.model.get_image_features(pixel_values, grid_thw).pooler_output
        merged = model.vggt_merger(pair_batch["features"].float(), (4, 4))
        injected = tuple(vit[i] + 0.7 * merged[i // s] for i in range(b * s))
        reference = model.qwen(
            input_ids=pair_batch["input_ids"],
            attention_mask=pair_batch["attention_mask"],
            mm_token_type_ids=pair_batch["mm_token_type_ids"],
            image_grid_thw=grid_thw,
            mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=injected)},
        ).logits
    logits = model.qwen.lm_head(ours.hidden_states)
    valid = pair_batch["attention_mask"].bool()
    torch.testing.assert_close(logits[valid], reference[valid], rtol=1e-4, atol=1e-4)


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


def test_the_qwen3_3d_term_reaches_exactly_its_own_samples_visual_positions_deepstack_kept(
    sample_index: DatasetIndex, two_samples: list[Sample],
) -> None:
    """Micro-batch of 2. The LLM's input embeddings at lam = 0.5 differ from those at lam = 0
    exactly at the image pads, by 0.5 x merger(that sample's feature) on each of its 9 images;
    changing sample 1's feature changes sample 1's image pads only. The DeepStack inputs are the
    base's own (its ViT's deepstack features at the image pads) whatever lam. And transformers'
    Qwen3-VL forward fed these fused embeddings as its encoder output gives janus's logits."""
    pair_batch = make_batch(sample_index, two_samples, base=QWEN3)
    plain, fused = tiny_model(lam=0.0, base=QWEN3).eval(), tiny_model(lam=0.5, base=QWEN3).eval()
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


def test_at_lam_0_the_model_is_the_plain_base_forward(base: BaseCase, base_pair_batch: dict[str, torch.Tensor]
                                                      ) -> None:
    """With lam = 0 the model is the plain base (``Qwen2_5_VLForConditionalGeneration``,
    ``Qwen3VLForConditionalGeneration``): its logits are those of the base's own forward on
    (input_ids, pixel_values, ...), and our gathered-logits CE equals the CE of those logits."""
    batch = base_pair_batch
    model = tiny_model(lam=0.0, base=base).eval()
    assert isinstance(model.qwen, base.base.transformers_class())
    with torch.no_grad():
        parts = model(batch).loss_parts
        ours = model.qwen.lm_head(model(batch, return_hidden=True).hidden_states)
        pixel_values, grid_thw = qwen_pixel_values(batch["frames"].flatten(0, 1), base=base.base)
        logits = model.qwen(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            mm_token_type_ids=batch["mm_token_type_ids"],
            pixel_values=pixel_values,
            image_grid_thw=grid_thw,
        ).logits
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[valid], logits[valid], rtol=0, atol=1e-6)
    per_token = F.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=IGNORE_INDEX, reduction="none"
    )
    torch.testing.assert_close(parts.segment_ce_sum.sum(1), per_token.sum(1), rtol=1e-5, atol=1e-4)
    assert parts.segment_tokens.sum().item() == supervised_count(batch)


# --------------------------------------------------------------------------- cached vs live


def test_cached_and_live_features_give_the_same_loss(pair_batch: dict[str, torch.Tensor]) -> None:
    """Features computed once and passed in (the cache) and features the model computes from the
    same frames (live) give the same features and loss; the cached path never runs VGGT."""
    model = tiny_model(live=True).eval()
    vggt_calls: list[int] = []
    hook = tiny_encoder().model.patch_embed.register_forward_pre_hook(lambda *_: vggt_calls.append(1))
    try:
        config = LossConfig()
        den = LossDenominators.from_batches([pair_batch])
        with torch.no_grad():
            cached = model(pair_batch)
            assert not vggt_calls
            live_batch = {k: v for k, v in pair_batch.items() if k != "features"}
            live = model(live_batch)
            assert vggt_calls
    finally:
        hook.remove()
    assert live.features.dtype == cached.features.dtype == torch.bfloat16
    assert torch.equal(live.features, cached.features)
    live_loss = micro_batch_loss(live.loss_parts, den, config, 0)
    assert live_loss.item() == micro_batch_loss(cached.loss_parts, den, config, 0).item()

    # Without an encoder the model needs cached features, and says so.
    with pytest.raises(ModelInputError, match="no 'features'.*without a VGGT encoder"):
        tiny_model()(live_batch)


# ----------------------------------------------------------------------------- logits, loss


def test_lm_head_sees_only_the_supervised_positions(pair_batch: dict[str, torch.Tensor]) -> None:
    model = tiny_model()
    rows: list[int] = []
    model.qwen.lm_head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    out = model(pair_batch)
    assert rows == [supervised_count(pair_batch)] == [out.loss_parts.logit_rows]
    assert rows[0] < pair_batch["input_ids"].numel() // 2


def test_backward_reaches_trainable_parts_only(base: BaseCase, base_pair_batch: dict[str, torch.Tensor]) -> None:
    """Default trainable parts: the LLM, the ViT's mergers (the projector; Qwen3-VL's DeepStack
    mergers included), the VGGT merger and the action head get gradients; the ViT's patch embedding,
    learned position embeddings (Qwen3-VL) and blocks none, nor the frozen VGGT."""
    model = tiny_model(base=base)
    parts = {name: part_of(name) for name, _ in model.named_parameters()}
    assert {n for n, part in parts.items() if "deepstack_merger_list" in n and part != "projector"} == set()
    assert any(n.startswith("qwen.model.visual.pos_embed.") and part == "vision_tower" for n, part in parts.items()) \
        == (base.base.position_embedding_mode == "learned+rope")
    config = LossConfig(distill_loss_weight=1.0)
    den = LossDenominators.from_batches([base_pair_batch])
    loss = micro_batch_loss(model(base_pair_batch).loss_parts, den, config, 0)
    loss.backward()
    touched = {part: False for part in ("language_model", "projector", "vggt_merger", "action_head")}
    for name, param in model.named_parameters():
        part = parts[name]
        if part == "vision_tower":
            assert param.grad is None, name
        elif param.grad is not None and param.grad.abs().sum() > 0:
            touched[part] = True
    assert all(touched.values()), touched
    assert all(p.grad is None for p in tiny_encoder().model.parameters())
    deepstack = {n: p.grad for n, p in model.named_parameters() if "deepstack_merger_list" in n}
    assert bool(deepstack) == base.base.deepstack
    assert [n for n, g in deepstack.items() if g is None or not g.abs().sum() > 0] == []


def test_gradient_checkpointing_toggles_and_keeps_the_loss(pair_batch: dict[str, torch.Tensor]) -> None:
    model = tiny_model().train()
    config = LossConfig()
    den = LossDenominators.from_batches([pair_batch])
    mlp = model.qwen.model.language_model.layers[0].mlp
    mlp_runs: list[int] = []
    mlp.register_forward_pre_hook(lambda *_: mlp_runs.append(1))

    def loss_grad_runs() -> tuple[float, torch.Tensor, int]:
        model.zero_grad(set_to_none=True)
        mlp_runs.clear()
        loss = micro_batch_loss(model(pair_batch).loss_parts, den, config, 0)
        loss.backward()
        return loss.item(), mlp.up_proj.weight.grad.clone(), len(mlp_runs)

    plain = loss_grad_runs()
    assert not model.gradient_checkpointing
    model.set_gradient_checkpointing(True)
    assert model.gradient_checkpointing
    checkpointed = loss_grad_runs()
    model.set_gradient_checkpointing(False)
    assert not model.gradient_checkpointing
    assert checkpointed[0] == pytest.approx(plain[0], rel=1e-6)
    torch.testing.assert_close(checkpointed[1], plain[1])
    assert (plain[2], checkpointed[2]) == (1, 2)  # the decoder layer is recomputed in the backward


# ------------------------------------------------------------------------ trainable, groups


def test_default_trainable_and_frozen_sets_and_learning_rate_groups() -> None:
    model = tiny_model(live=True)
    names = {name: p.requires_grad for name, p in model.named_parameters()}
    assert all(not trainable for name, trainable in names.items() if name.startswith("qwen.model.visual.blocks."))
    assert not names["qwen.model.visual.patch_embed.proj.weight"]
    for name in (
        "qwen.model.visual.merger.mlp.0.weight",
        "qwen.model.language_model.embed_tokens.weight",
        "qwen.model.language_model.layers.1.self_attn.q_proj.weight",
        "qwen.lm_head.weight",
        "vggt_merger.norm.weight",
        "action_head.net.0.weight",
    ):
        assert names[name], name
    # The frozen VGGT is not part of the module: none of its parameters, no checkpoint entries.
    vggt = {id(p) for p in tiny_encoder().model.parameters()}
    assert not vggt & {id(p) for p in model.parameters()}
    own = sum(p.numel() for m in (model.qwen, model.vggt_merger, model.action_head) for p in m.parameters())
    assert sum(p.numel() for p in model.parameters()) == own
    assert all(k.startswith(("qwen.", "vggt_merger.", "action_head.")) for k in model.state_dict())

    groups = model.parameter_groups()
    assert [(g["name"], g["lr"]) for g in groups] == [("base", 2e-5), ("projector", 1e-5)]
    grouped = [n for g in groups for n in g["param_names"]]
    assert sorted(grouped) == sorted(n for n, trainable in names.items() if trainable)
    assert len(grouped) == len(set(grouped))
    projector = groups[1]["param_names"]
    assert all(n.startswith(("qwen.model.visual.merger.", "vggt_merger.")) for n in projector)
    assert all(len(g["params"]) == len(g["param_names"]) for g in groups)
    optimizer = torch.optim.AdamW(groups)
    assert [g["lr"] for g in optimizer.param_groups] == [2e-5, 1e-5]


def test_trainable_parts_are_configurable() -> None:
    model = tiny_model(trainable=TrainableParts(language_model=False, vision_tower=True, action_head=False))
    groups = {g["name"]: g for g in model.parameter_groups(lr_base=1.0, lr_projector=0.5, lr_vision=0.25)}
    assert set(groups) == {"projector", "vision"}
    assert groups["vision"]["lr"] == 0.25
    assert "qwen.model.visual.patch_embed.proj.weight" in groups["vision"]["param_names"]
    assert not model.qwen.lm_head.weight.requires_grad
    assert not any(p.requires_grad for p in model.action_head.parameters())


# ---------------------------------------------------------------------- loading, bad input


def test_random_init_is_seeded_and_attention_falls_back_to_sdpa() -> None:
    settings = LanguageModelSettings(path=QWEN_DIR, random_init=True, seed=3)
    a, b = load_qwen(settings), load_qwen(settings)
    c = load_qwen(LanguageModelSettings(path=QWEN_DIR, random_init=True, seed=4))
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert attention_implementation("cpu") == "sdpa"
    assert a.config._attn_implementation == "sdpa"
    with pytest.raises(OSError, match="random_init"):
        load_qwen(LanguageModelSettings(path=QWEN_DIR, random_init=False, seed=0))


def test_bfloat16_model_keeps_loss_sums_in_float32(pair_batch: dict[str, torch.Tensor]) -> None:
    qwen = load_qwen(LanguageModelSettings(path=QWEN_DIR, random_init=True, seed=0), dtype=torch.bfloat16)
    model = JanusVLNModel(qwen, FEATURE_DIM, tiny_model().config)
    assert model.vggt_merger.norm.weight.dtype == model.action_head.net[0].weight.dtype == torch.bfloat16
    with torch.no_grad():
        out = model(pair_batch, return_hidden=True)
        reference = tiny_model()(pair_batch)
    assert out.hidden_states.dtype == torch.bfloat16
    assert out.loss_parts.segment_ce_sum.dtype == out.action_logits.dtype == torch.float32
    torch.testing.assert_close(out.loss_parts.segment_ce_sum, reference.loss_parts.segment_ce_sum, rtol=2e-2, atol=0.5)


def test_each_bases_tiny_profile_builds_its_model_without_vggt_for_cached_training(
    base: BaseCase, base_pair_batch: dict[str, torch.Tensor],
) -> None:
    """The base follows qwen.path alone."""
    profile = load_profile(base.profile)
    assert vggt_feature_dim(profile.vggt) == FEATURE_DIM
    model = JanusVLNModel.from_profile(profile, JanusModelConfig(merger_hidden=MERGER_HIDDEN)).eval()
    assert model.base is base.base and isinstance(model.qwen, base.base.transformers_class())
    assert model.encoder is None and model.feature_dim == FEATURE_DIM
    assert model.device.type == "cpu" and model.qwen.dtype == torch.float32
    with torch.no_grad():
        assert torch.isfinite(model(base_pair_batch).loss_parts.segment_ce_sum).all()


def test_a_live_qwen3_batch_without_vggts_frames_is_refused_in_one_line(sample_index: DatasetIndex,
                                                                      two_samples: list[Sample]) -> None:
    """The live VGGT never runs on Qwen3-VL's frames: a batch with neither cached features nor
    VGGT's own frames is refused."""
    live = JanusVLNModel.from_profile(load_profile(QWEN3.profile), JanusModelConfig(merger_hidden=MERGER_HIDDEN),
                                      live=True)
    with pytest.raises(ModelInputError, match=r"^a live Qwen3-VL batch needs 'vggt_frames' \(VGGT's frames of the "
                                              r"same sources, janus_train\.data\.samples\.LiveFrames\): VGGT does not run on "
                                              r"Qwen3-VL's frames$"):
        live(make_batch(sample_index, two_samples, with_features=False, base=QWEN3))


def test_batches_that_do_not_fit_the_model_are_refused(base: BaseCase, base_pair_batch: dict[str, torch.Tensor]
                                                       ) -> None:
    pair_batch = base_pair_batch
    model = tiny_model(base=base)
    pads_error = r"image-pad tokens per sample \[36, 36\] do not match the frames \(32 = "
    with pytest.raises(ModelInputError, match=pads_error):
        model(dict(pair_batch, frames=pair_batch["frames"][:, 1:], features=pair_batch["features"]))
    with pytest.raises(ModelInputError, match=r"features have shape \(2, 16, 64\), expected \[2, 16, 128\]"):
        model(dict(pair_batch, features=pair_batch["features"][..., :64]))
    with pytest.raises(ModelInputError, match=r"features have shape \(2, 4, 128\), expected \[2, 16, 128\] "
                                              r"\(batch, 4x4 VGGT patches"):  # off the frames' grid
        model(dict(pair_batch, features=pair_batch["features"][:, :4]))
    with pytest.raises(ModelInputError, match="frames must be uint8"):
        model(dict(pair_batch, frames=pair_batch["frames"].float()))
    with pytest.raises(ModelInputError, match="no 'labels'"):
        model({k: v for k, v in pair_batch.items() if k != "labels"})
    assert VISUAL_TOKENS * 9 == 36
