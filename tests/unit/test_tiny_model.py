"""The tiny Qwen2.5-VL directory of the ``tiny`` profile and the tiny VGGT config.

The committed files (and the tiny Qwen3-VL's of ``tiny-qwen3``) must be exactly what ``tools/tiny_model.py`` generates, must load through
transformers' Auto classes like a real Qwen2.5-VL directory, and must give a model that trains on
a prompt with images.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from helpers.bases import BaseCase
from janus_core.bases import QWEN2_5_VL
from janus_core.index import ACTIONS
from janus_core.qwen_vision import IM_END, IM_START, IMAGE_PAD, QWEN_SPECIAL_TOKENS
from janus_core.vggt.config import AggregatorConfig
from janus_train.data.prompt import ANSWER_LABELS
from tools.tiny_corpus import tiny_corpus
from tools.tiny_model import (
    QWEN_DIR_FILES,
    TINY_QWEN,
    TINY_VGGT_AGGREGATOR,
    TinyQwenSpec,
    write_tiny_qwen_dir,
    write_tiny_vggt_config,
)

REPO = Path(__file__).resolve().parents[2]
QWEN_DIR = REPO / "configs" / "models" / "tiny-qwen2_5_vl"
VGGT_CONFIG = REPO / "configs" / "models" / "tiny-vggt.json"
GOLDEN_VGGT_CONFIG = REPO / "tests" / "data" / "vggt_golden" / "config.json"
REGENERATE = (
    "regenerate with: python -m tools.tiny_model configs/models/tiny-qwen2_5_vl "
    "--vggt-config configs/models/tiny-vggt.json"
)

FRAME = 56  # 4x4 patches of 14 px -> 2x2 merged -> 4 visual tokens per image


@pytest.fixture(scope="module")
def config():
    return AutoConfig.from_pretrained(QWEN_DIR)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(QWEN_DIR)


@pytest.fixture(scope="module")
def image_processor():
    return AutoImageProcessor.from_pretrained(QWEN_DIR)


def _frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (FRAME, FRAME, 3), dtype=np.uint8) for _ in range(n)]


def _pixel_values(image_processor, frames: list[np.ndarray]):
    # min_pixels = max_pixels = H*W: the frame is already a multiple of 28, so nothing is resized.
    size = {"shortest_edge": FRAME * FRAME, "longest_edge": FRAME * FRAME}
    return image_processor(images=frames, size=size, return_tensors="pt")


def _expand_image_pads(text: str, image_grid_thw: torch.Tensor, merge_size: int) -> str:
    """What Qwen's processor does: the i-th <|image_pad|> becomes one pad per visual token of image i."""
    pieces = text.split(IMAGE_PAD)
    assert len(pieces) - 1 == len(image_grid_thw), "one <|image_pad|> per image expected in the template output"
    counts = [int(grid.prod()) // merge_size**2 for grid in image_grid_thw]
    return pieces[0] + "".join(IMAGE_PAD * n + piece for n, piece in zip(counts, pieces[1:]))


def _two_image_batch(tokenizer, image_processor, config) -> dict[str, torch.Tensor]:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "image"},
                {"type": "text", "text": "Your task is to: walk past the sofa and stop at the kitchen door."},
            ],
        },
        {"role": "assistant", "content": "SUBINSTRUCTION: Walk past the sofa.\nACTION: MOVE_FORWARD"},
    ]
    vision = _pixel_values(image_processor, _frames(2))
    text = _expand_image_pads(
        tokenizer.apply_chat_template(messages, tokenize=False), vision["image_grid_thw"], image_processor.merge_size
    )
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return {
        "input_ids": input_ids,
        "pixel_values": vision["pixel_values"],
        "image_grid_thw": vision["image_grid_thw"],
        # Qwen2.5-VL in transformers 5 needs the modality of every token to build M-RoPE positions.
        "mm_token_type_ids": (input_ids == config.image_token_id).int(),
    }


def _random_model(config, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


# --- reproducibility ----------------------------------------------------------------------------


def test_generator_reproduces_the_committed_qwen_directory_byte_for_byte(base: BaseCase, tmp_path: Path) -> None:
    """Each base's tiny directory (the tiny profile's, and tiny-qwen3's: the same tokenizer with
    Qwen3-VL's template and config)."""
    written = write_tiny_qwen_dir(tmp_path / "qwen", base=base.base)
    assert sorted(p.name for p in written) == sorted(QWEN_DIR_FILES)
    committed = base.qwen_dir
    assert sorted(p.name for p in committed.iterdir()) == sorted(QWEN_DIR_FILES), f"stray files in {committed}"
    regenerate = f"regenerate with: python -m tools.tiny_model configs/models/{committed.name} --base {base}"
    for name in QWEN_DIR_FILES:
        regenerated = (tmp_path / "qwen" / name).read_bytes()
        assert regenerated == (committed / name).read_bytes(), f"{name} differs; {regenerate}"


def test_generator_reproduces_the_committed_tiny_vggt_config(tmp_path: Path) -> None:
    written = write_tiny_vggt_config(tmp_path / "tiny-vggt.json")
    assert written.read_bytes() == VGGT_CONFIG.read_bytes(), REGENERATE


def test_corpus_is_deterministic_and_covers_actions_and_answer_labels() -> None:
    corpus = tiny_corpus()
    assert corpus == tiny_corpus()
    text = "\n".join(corpus)
    for word in (*ACTIONS, *ANSWER_LABELS, "kitchen", "sofa", "turn left", "forward"):
        assert word in text


# --- tiny VGGT config ---------------------------------------------------------------------------


def test_tiny_vggt_config_has_the_aggregator_keys_of_a_vggt_config_and_tiny_sizes() -> None:
    tiny = json.loads(VGGT_CONFIG.read_text())
    golden = json.loads(GOLDEN_VGGT_CONFIG.read_text())["aggregator"]
    assert tiny.keys() == golden.keys()
    assert tiny["patch_embed"].keys() == golden["patch_embed"].keys()
    config = AggregatorConfig.from_dict(tiny)
    assert 64 <= config.embed_dim <= 128 and config.depth == 2 and config.num_heads == 4
    assert config.patch_embed.depth == 2 and config.patch_embed.embed_dim == config.embed_dim
    assert tiny == TINY_VGGT_AGGREGATOR


# --- tokenizer ----------------------------------------------------------------------------------


def test_auto_tokenizer_loads_a_fast_qwen2_tokenizer_with_qwen_special_tokens(tokenizer, config) -> None:
    assert tokenizer.is_fast and type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert 1000 <= len(tokenizer) <= 2048
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == "<|endoftext|>"
    assert set(QWEN_SPECIAL_TOKENS) <= set(tokenizer.all_special_tokens)
    ids = tokenizer.convert_tokens_to_ids(list(QWEN_SPECIAL_TOKENS))
    # The specials follow the learned vocabulary in Qwen's order and are never split.
    assert ids == list(range(len(tokenizer) - len(QWEN_SPECIAL_TOKENS), len(tokenizer)))
    text = "".join(QWEN_SPECIAL_TOKENS)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.video_token_id == tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert config.vision_end_token_id == tokenizer.convert_tokens_to_ids("<|vision_end|>")


@pytest.mark.parametrize(
    "text",
    [
        "Walk forward past the sofa and turn left at the kitchen door.",
        "SUBINSTRUCTION: Turn right.\n2D_DESCRIPTION: A lamp.\n3D_DESCRIPTION: 2.5 m ahead.\nACTION: STOP",
        "  leading spaces,\ttabs\r\nand CRLF, trailing   ",
        "Unseen words: zyzzyva quixotic Ｆｕｌｌｗｉｄｔｈ",
        "日本語のテキスト, العربية, Ελληνικά, emoji 🤖🚪 and symbols ∑∫√ © ÿ",
        "control bytes \x00\x01\x7f and <|im_start|> inside text",
    ],
)
def test_tokenizer_round_trips_any_nfc_text(tokenizer, text: str) -> None:
    assert unicodedata.is_normalized("NFC", text)  # the normaliser is NFC, like Qwen's
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_the_assistant_header_is_the_references_three_tokens(tokenizer) -> None:
    """The reference supervises everything after the 3-token header <|im_start|>, assistant, \\n;
    the tiny tokenizer must split the header the same way as Qwen2.5-VL's (and the system and user
    role names likewise stay one token each)."""
    ids = tokenizer(f"{IM_START}assistant\n", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [IM_START, "assistant", "Ċ"]
    for role in ("system", "user", "assistant"):
        assert tokenizer(role, add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(role)]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "ACTION: STOP"}], tokenize=False
    )
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    header = len(tokens) - 1 - tokens[::-1].index(IM_START)  # the last turn is the assistant's
    assert tokens[header : header + 3] == [IM_START, "assistant", "Ċ"]


def test_transformers_tokenizer_encodes_exactly_like_the_tokenizer_json(tokenizer) -> None:
    """transformers rebuilds a Qwen2Tokenizer from vocab + merges with Qwen2's own pipeline; the
    file must describe that same pipeline, or ids would depend on how the directory is loaded."""
    backend = Tokenizer.from_file(str(QWEN_DIR / "tokenizer.json"))
    samples = tiny_corpus(seed=7, n_episodes=20) + ["Ｆｕｌｌ  width\n\n 🤖 <|vision_start|><|image_pad|>"]
    for text in samples:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == backend.encode(text).ids


def test_tokenizer_learned_the_navigation_vocabulary(tokenizer) -> None:
    text = " ".join(tiny_corpus(seed=99, n_episodes=30))  # unseen draws from the same language
    n_words = len(text.split())
    n_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert n_tokens < 1.6 * n_words
    for word in ("Ġkitchen", "Ġsofa", "Ġforward", "ĠSTOP"):
        assert word in tokenizer.get_vocab()


# --- chat template ------------------------------------------------------------------------------


def test_chat_template_renders_qwen2_5_vl_turns_with_images(tokenizer) -> None:
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Where next?"}]},
        {"role": "assistant", "content": "ACTION: STOP"},
    ]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>Where next?<|im_end|>\n"
        "<|im_start|>assistant\nACTION: STOP<|im_end|>\n"
    )


def test_chat_template_keeps_a_given_system_turn_and_opens_the_assistant_turn(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are a navigation agent."},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image", "image": "a.png"}]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a navigation agent.<|im_end|>\n"
        "<|im_start|>user\nLook: <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_numbers_images_and_videos_with_add_vision_id(tokenizer) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "video"}, {"type": "image"}, {"type": "text", "text": "?"}],
        }
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_vision_id=True)
    assert rendered.endswith(
        "<|im_start|>user\n"
        "Picture 1: <|vision_start|><|image_pad|><|vision_end|>"
        "Video 1: <|vision_start|><|video_pad|><|vision_end|>"
        "Picture 2: <|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n"
    )


# --- model config and image processor -----------------------------------------------------------


def test_model_config_is_a_consistent_tiny_qwen2_5_vl(config, tokenizer) -> None:
    text, vision = config.text_config, config.vision_config
    assert type(config).__name__ == "Qwen2_5_VLConfig"
    assert config.architectures == ["Qwen2_5_VLForConditionalGeneration"]
    assert text.vocab_size >= len(tokenizer) and text.vocab_size % TINY_QWEN.vocab_multiple == 0
    sizes = (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads)
    assert sizes == (64, 2, 4, 2)
    head_dim = text.hidden_size // text.num_attention_heads
    assert 2 * sum(text.rope_parameters["mrope_section"]) == head_dim
    assert (vision.depth, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (2, 14, 2, 2)
    assert vision.window_size == 112 and all(0 <= i < vision.depth for i in vision.fullatt_block_indexes)
    assert vision.out_hidden_size == text.hidden_size
    assert config.tie_word_embeddings is False and text.tie_word_embeddings is False
    assert config.dtype == torch.float32
    assert text.eos_token_id == tokenizer.eos_token_id and text.pad_token_id == tokenizer.pad_token_id


def test_spec_rejects_an_mrope_section_that_does_not_fit_the_head_dim() -> None:
    with pytest.raises(ValueError, match="mrope_section"):
        TinyQwenSpec(mrope_section=(16, 24, 24))
    with pytest.raises(ValueError, match="fullatt_block_indexes"):
        TinyQwenSpec(fullatt_block_indexes=(2,))


def test_image_processor_patchifies_a_56px_frame_into_a_1x4x4_grid(image_processor) -> None:
    assert (image_processor.patch_size, image_processor.merge_size, image_processor.temporal_patch_size) == (14, 2, 2)
    assert tuple(image_processor.image_mean) == QWEN2_5_VL.image_mean and tuple(image_processor.image_std) == QWEN2_5_VL.image_std
    out = _pixel_values(image_processor, _frames(2))
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    # 16 patches per frame, each 3 channels x 2 (temporal) x 14 x 14 values.
    assert tuple(out["pixel_values"].shape) == (32, 3 * 2 * 14 * 14)


# --- the model ----------------------------------------------------------------------------------


def test_prompt_gets_one_image_pad_per_visual_token(tokenizer, image_processor, config) -> None:
    batch = _two_image_batch(tokenizer, image_processor, config)
    per_image = (FRAME // 14) * (FRAME // 14) // 4
    assert int((batch["input_ids"] == config.image_token_id).sum()) == 2 * per_image
    features = _random_model(config).model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
    assert [tuple(f.shape) for f in features.pooler_output] == [(per_image, config.text_config.hidden_size)] * 2


def test_tiny_model_trains_on_a_two_image_prompt(tokenizer, image_processor, config) -> None:
    batch = _two_image_batch(tokenizer, image_processor, config)
    model = _random_model(config).train()
    labels = batch["input_ids"].masked_fill(batch["mm_token_type_ids"].bool(), -100)
    out = model(**batch, labels=labels)
    assert torch.isfinite(out.loss)
    # Random init: the loss is that of a near-uniform guess over the vocabulary.
    assert abs(out.loss.item() - np.log(config.text_config.vocab_size)) < 1.0
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    for name in ("lm_head.weight", "model.visual.merger.mlp.0.weight", "model.visual.blocks.0.attn.qkv.weight"):
        assert grads[name] is not None and torch.isfinite(grads[name]).all() and grads[name].abs().sum() > 0, name
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()


def test_save_and_from_pretrained_round_trip_keeps_the_logits(
    tmp_path: Path, tokenizer, image_processor, config
) -> None:
    batch = _two_image_batch(tokenizer, image_processor, config)
    model = _random_model(config, seed=3)
    model.save_pretrained(tmp_path)
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)


def test_auto_processor_inserts_one_image_pad_per_visual_token(config) -> None:
    """Qwen2_5_VLProcessor needs a video processor, which in transformers 5 needs torchvision; the
    CPU install has none, so this runs only where torchvision is installed (GPU machines)."""
    pytest.importorskip("torchvision")
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(QWEN_DIR)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Go."}]}]
    text = processor.apply_chat_template(messages, tokenize=False)
    size = {"shortest_edge": FRAME * FRAME, "longest_edge": FRAME * FRAME}
    batch = processor(text=[text], images=_frames(2), images_kwargs={"size": size}, return_tensors="pt")
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    assert int((batch["input_ids"] == config.image_token_id).sum()) == 2 * 4
