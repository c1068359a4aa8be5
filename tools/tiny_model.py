"""The tiny Qwen2.5-VL of the ``tiny`` profile and the tiny Qwen3-VL, built offline and reproducibly.

Nothing can be downloaded, so the tiny profile's model directory is generated here from code: a
Qwen2.5-VL ``config.json`` with tiny sizes (random weights are drawn by whoever builds the model),
a real byte-level BPE fast tokenizer trained on a small built-in corpus of navigation text with
Qwen2.5-VL's special tokens, Qwen2.5-VL's chat template, and the Qwen2-VL image processor
settings. The directory loads with ``AutoConfig``/``AutoTokenizer``/``AutoProcessor`` and
``Qwen2_5_VLForConditionalGeneration`` exactly like a real checkpoint directory, so the trainer
runs the same code path on the tiny and the 7B profile.

A build-time asset generator, outside the runtime packages: the committed copy lives in
``configs/models/tiny-qwen2_5_vl``; regenerate it from the repository root with
``python -m tools.tiny_model configs/models/tiny-qwen2_5_vl --vggt-config
configs/models/tiny-vggt.json``. The tiny VGGT aggregator
config ``configs/models/tiny-vggt.json`` is written by :func:`write_tiny_vggt_config`.

The tiny Qwen3-VL (``configs/models/tiny-qwen3_vl``, ``python -m tools.tiny_model
configs/models/tiny-qwen3_vl --base qwen3_vl``) has the same tokenizer (the two bases share their
chat special tokens), Qwen3-VL's chat template, 16-px patches with mean = std = 0.5, learned
position embeddings and two DeepStack layers, at the same tiny sizes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from janus_core.bases import BASES, QWEN2_5_VL, QWEN3_VL, QwenBase
from janus_core.qwen_vision import (
    DEFAULT_SYSTEM_PROMPT,
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    QWEN_SPECIAL_TOKENS,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
)
from tools.tiny_corpus import DEFAULT_CORPUS_SEED, tiny_corpus

# Qwen2.5-VL's special tokens follow the learned BPE vocabulary, in Qwen's id order (there they
# start at 151643). The trainer relies on the vision ones; the rest keep the tokenizer's
# special-token set identical to the real model's.

# The chat roles are single tokens in Qwen2.5-VL's vocabulary, so the assistant header is the three
# tokens <|im_start|>, assistant, \n (the reference supervises everything after them); the tiny
# BPE would otherwise split them into pieces.
CHAT_ROLES: tuple[str, ...] = ("system", "user", "assistant")

# Qwen2's pre-tokenizer split (contractions, letter runs with one leading non-letter, single
# digits, punctuation runs, newlines, spaces); byte-level encoding after it makes any text
# encodable without an unknown token.
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Behaves like Qwen2.5-VL's template: a default system turn when the conversation does not start
# with one; every turn is "<|im_start|>role\n...<|im_end|>\n"; an image item renders as
# <|vision_start|><|image_pad|><|vision_end|> (the processor later repeats <|image_pad|> once per
# visual token), a video item likewise with <|video_pad|>; add_vision_id prefixes
# "Picture n: " / "Video n: "; add_generation_prompt opens the assistant turn.
CHAT_TEMPLATE = """\
{#- Every tag trims the whitespace around it: only the quoted strings reach the output. -#}
{%- set counts = namespace(image=0, video=0) -%}
{%- for message in messages -%}
    {%- if loop.first and message['role'] != 'system' -%}
        {{- '<|im_start|>system\\n""" + DEFAULT_SYSTEM_PROMPT + """<|im_end|>\\n' -}}
    {%- endif -%}
    {{- '<|im_start|>' + message['role'] + '\\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] -}}
    {%- else -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}
                {%- set counts.image = counts.image + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' + counts.image|string + ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif item['type'] == 'video' or 'video' in item -%}
                {%- set counts.video = counts.video + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' + counts.video|string + ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in item -%}
                {{- item['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

# Behaves like Qwen3-VL-Instruct's template for text and image turns: as Qwen2.5-VL's, except that a
# conversation without a system turn gets none (Qwen3 templates add no default system prompt).
QWEN3_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    """    {%- if loop.first and message['role'] != 'system' -%}
        {{- '<|im_start|>system\\n""" + DEFAULT_SYSTEM_PROMPT + """<|im_end|>\\n' -}}
    {%- endif -%}
""", "")
CHAT_TEMPLATES: dict[str, str] = {QWEN2_5_VL.model_type: CHAT_TEMPLATE, QWEN3_VL.model_type: QWEN3_CHAT_TEMPLATE}

# Qwen2-VL image processor settings (Qwen2.5-VL-7B-Instruct's; Qwen3-VL's differ in patch size and
# mean/std, janus_core.bases). Callers set min/max pixels per resolution so that no resize happens.
DEFAULT_MIN_PIXELS = 3136
DEFAULT_MAX_PIXELS = 12845056


QWEN_DIR_FILES: tuple[str, ...] = (
    "chat_template.jinja",
    "config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


@dataclass(frozen=True)
class TinyQwenSpec:
    """Sizes of the tiny Qwen2.5-VL: the 7B architecture shrunk until a CPU step takes milliseconds."""

    text_hidden_size: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate_size: int = 128
    # M-RoPE splits the head's rotary pairs (head_dim / 2) into temporal, height and width parts;
    # [2, 3, 3] is the 7B's [16, 24, 24] scaled from head_dim 128 to 16.
    mrope_section: tuple[int, int, int] = (2, 3, 3)
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    vision_hidden_size: int = 32
    vision_depth: int = 2
    vision_heads: int = 2
    vision_intermediate_size: int = 64
    # The 7B uses full attention in the last block of every 8 ([7, 15, 23, 31]); with 2 blocks the
    # first is windowed and the second full, so both attention kinds run.
    fullatt_block_indexes: tuple[int, ...] = (1,)
    window_size: int = 112
    tokens_per_second: int = 2
    # Qwen3-VL only: 3 blocks, of which the first two feed DeepStack (the 8B: 27 blocks, [8, 16,
    # 24]); a 4x4 learned position grid interpolated to each image's grid (the 8B: 48x48).
    qwen3_vision_depth: int = 3
    deepstack_visual_indexes: tuple[int, ...] = (0, 1)
    # DeepStack feeds LLM layers 0 and 1; a third layer lets both reach the loss (what DeepStack
    # adds after the last layer changes only the visual positions' outputs).
    qwen3_text_layers: int = 3
    qwen3_position_embeddings: int = 16
    qwen3_mrope_section: tuple[int, int, int] = (3, 3, 2)
    # Upper bound of the learned vocabulary (256 byte symbols + merges); the built-in corpus runs
    # out of pairs seen twice at about 1.3k, which with the specials gives ~1.4k embedding rows.
    bpe_vocab_size: int = 2048
    vocab_multiple: int = 64
    corpus_seed: int = DEFAULT_CORPUS_SEED

    def __post_init__(self) -> None:
        if self.text_hidden_size % self.text_heads or self.text_heads % self.text_kv_heads:
            raise ValueError(
                f"text hidden {self.text_hidden_size} / heads {self.text_heads} / kv heads "
                f"{self.text_kv_heads} do not divide evenly"
            )
        if 2 * sum(self.mrope_section) != self.text_head_dim:
            raise ValueError(
                f"mrope_section {list(self.mrope_section)} must sum to head_dim/2 = {self.text_head_dim // 2}"
            )
        if self.vision_hidden_size % self.vision_heads:
            raise ValueError(f"vision hidden {self.vision_hidden_size} is not divisible by {self.vision_heads} heads")
        if any(not 0 <= i < self.vision_depth for i in self.fullatt_block_indexes):
            raise ValueError(
                f"fullatt_block_indexes {list(self.fullatt_block_indexes)} must lie in [0, {self.vision_depth})"
            )

    @property
    def text_head_dim(self) -> int:
        return self.text_hidden_size // self.text_heads


TINY_QWEN = TinyQwenSpec()

# Constructor kwargs of janus_core.vggt.VGGTAggregator (keys of the ``aggregator`` section of a
# VGGT config): VGGT-1B's architecture at width 64 and depth 2, so a 9-frame window runs in well
# under a second on a CPU. The feature it yields is 2 * embed_dim = 128 wide.
TINY_VGGT_AGGREGATOR: dict[str, Any] = {
    "img_size": 518,
    "patch_size": 14,
    "embed_dim": 64,
    "depth": 2,
    "num_heads": 4,
    "mlp_ratio": 4.0,
    "num_register_tokens": 4,
    "qkv_bias": True,
    "proj_bias": True,
    "ffn_bias": True,
    "qk_norm": True,
    "rope_freq": 100,
    "attention": "causal",
    "patch_embed": {"embed_dim": 64, "depth": 2, "num_heads": 2, "mlp_ratio": 4.0},
}


# --- tokenizer ----------------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")
    return path


def _write_json(path: Path, data: Any) -> Path:
    # Fixed formatting so regenerated files compare byte for byte with the committed ones.
    return _write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def train_tiny_tokenizer(spec: TinyQwenSpec = TINY_QWEN) -> Tokenizer:
    """Train the byte-level BPE with Qwen2's normaliser, pre-tokenizer and decoder, then add the
    special tokens after the learned vocabulary."""
    tokenizer = Tokenizer(_bpe())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=spec.bpe_vocab_size,
        min_frequency=2,
        show_progress=False,
        # All 256 byte symbols, whether or not the corpus uses them: that is what makes every
        # string encodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(tiny_corpus(spec.corpus_seed), trainer=trainer)
    _make_whole_words(tokenizer, CHAT_ROLES)
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False) for token in QWEN_SPECIAL_TOKENS]
    )
    return tokenizer


def _bpe(vocab: dict[str, int] | None = None, merges: list[tuple[str, str]] | None = None) -> BPE:
    """Qwen2's BPE settings (byte-level symbols, no unknown token), empty or with a vocabulary."""
    return BPE(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        fuse_unk=False,
        byte_fallback=False,
    )


def _make_whole_words(tokenizer: Tokenizer, words: tuple[str, ...]) -> None:
    """Append the merges that make each word one token (left to right: ``s y`` then ``sy st`` ...).

    Appended merges rank after every learned one, so every learned token keeps its id and other
    text tokenises as before unless it contains the same pieces side by side.
    """
    for word in words:
        model = json.loads(tokenizer.to_str())["model"]
        vocab: dict[str, int] = model["vocab"]
        merges = [(a, b) for a, b in model["merges"]]
        pieces = tokenizer.encode(word).tokens
        while len(pieces) > 1:
            merged = pieces[0] + pieces[1]
            merges.append((pieces[0], pieces[1]))
            vocab.setdefault(merged, len(vocab))
            pieces = [merged, *pieces[2:]]
        tokenizer.model = _bpe(vocab, merges)


def _tokenizer_config(tokenizer: Tokenizer, spec: TinyQwenSpec) -> dict[str, Any]:
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in QWEN_SPECIAL_TOKENS
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "extra_special_tokens": [t for t in QWEN_SPECIAL_TOKENS if t != ENDOFTEXT],
        "model_max_length": spec.max_position_embeddings,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build_tiny_tokenizer(out_dir: str | Path, spec: TinyQwenSpec = TINY_QWEN,
                         base: QwenBase = QWEN2_5_VL) -> list[Path]:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and the base's ``chat_template.jinja``
    into ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    tokenizer = train_tiny_tokenizer(spec)
    return [
        _write_json(out / "tokenizer.json", json.loads(tokenizer.to_str())),
        _write_json(out / "tokenizer_config.json", _tokenizer_config(tokenizer, spec)),
        _write_text(out / "chat_template.jinja", CHAT_TEMPLATES[base.model_type]),
    ]


# --- model and processor configs ----------------------------------------------------------------


def padded_vocab_size(n_tokens: int, multiple: int = TINY_QWEN.vocab_multiple) -> int:
    """Embedding rows for ``n_tokens`` tokens, rounded up like Qwen's (152064 rows for 151665 tokens)."""
    return -(-n_tokens // multiple) * multiple


def qwen_config_dict(token_ids: dict[str, int], n_tokens: int, spec: TinyQwenSpec = TINY_QWEN) -> dict[str, Any]:
    """The ``config.json`` of the tiny model in transformers 5's nested form."""
    text_config = {
        "model_type": "qwen2_5_vl_text",
        "vocab_size": padded_vocab_size(n_tokens, spec.vocab_multiple),
        "hidden_size": spec.text_hidden_size,
        "intermediate_size": spec.text_intermediate_size,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "mrope_section": list(spec.mrope_section),
        },
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": token_ids[ENDOFTEXT],
        "eos_token_id": token_ids[IM_END],
        "pad_token_id": token_ids[ENDOFTEXT],
        # Set here too: the top-level flag is forced on when the text config asks for tying.
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    vision_config = {
        "model_type": "qwen2_5_vl_vision",
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden_size,
        "hidden_act": "silu",
        "intermediate_size": spec.vision_intermediate_size,
        "num_heads": spec.vision_heads,
        "in_channels": 3,
        "patch_size": QWEN2_5_VL.patch_size,
        "spatial_merge_size": QWEN2_5_VL.merge_size,
        "temporal_patch_size": QWEN2_5_VL.temporal_patch,
        "tokens_per_second": spec.tokens_per_second,
        "window_size": spec.window_size,
        "out_hidden_size": spec.text_hidden_size,
        "fullatt_block_indexes": list(spec.fullatt_block_indexes),
        "initializer_range": 0.02,
        "dtype": "float32",
    }
    return {
        "architectures": [QWEN2_5_VL.model_class],
        "model_type": QWEN2_5_VL.model_type,
        "text_config": text_config,
        "vision_config": vision_config,
        "image_token_id": token_ids[IMAGE_PAD],
        "video_token_id": token_ids[VIDEO_PAD],
        "vision_start_token_id": token_ids[VISION_START],
        "vision_end_token_id": token_ids[VISION_END],
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def qwen3_config_dict(token_ids: dict[str, int], n_tokens: int, spec: TinyQwenSpec = TINY_QWEN) -> dict[str, Any]:
    """The ``config.json`` of the tiny Qwen3-VL (transformers 5's ``qwen3_vl``): Qwen3-VL-8B's
    architecture (configs/models/qwen3_vl_8b) at the tiny sizes of ``spec``."""
    text_config = {
        "model_type": "qwen3_vl_text",
        "vocab_size": padded_vocab_size(n_tokens, spec.vocab_multiple),
        "hidden_size": spec.text_hidden_size,
        "intermediate_size": spec.text_intermediate_size,
        "num_hidden_layers": spec.qwen3_text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_kv_heads,
        "head_dim": spec.text_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            # Interleaved T/H/W frequencies; [3, 3, 2] is the 8B's [24, 20, 20] scaled from
            # head_dim 128 to 16 (the interleave needs 3 * section >= head_dim / 2 for H).
            "mrope_section": list(spec.qwen3_mrope_section),
            "mrope_interleaved": True,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": token_ids[ENDOFTEXT],
        "eos_token_id": token_ids[IM_END],
        "pad_token_id": token_ids[ENDOFTEXT],
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    vision_config = {
        "model_type": "qwen3_vl_vision",
        "depth": spec.qwen3_vision_depth,
        "hidden_size": spec.vision_hidden_size,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": spec.vision_intermediate_size,
        "num_heads": spec.vision_heads,
        "in_channels": 3,
        "patch_size": QWEN3_VL.patch_size,
        "spatial_merge_size": QWEN3_VL.merge_size,
        "temporal_patch_size": QWEN3_VL.temporal_patch,
        "out_hidden_size": spec.text_hidden_size,
        "num_position_embeddings": spec.qwen3_position_embeddings,
        "deepstack_visual_indexes": list(spec.deepstack_visual_indexes),
        "initializer_range": 0.02,
        "dtype": "float32",
    }
    return {
        "architectures": [QWEN3_VL.model_class],
        "model_type": QWEN3_VL.model_type,
        "text_config": text_config,
        "vision_config": vision_config,
        "image_token_id": token_ids[IMAGE_PAD],
        "video_token_id": token_ids[VIDEO_PAD],
        "vision_start_token_id": token_ids[VISION_START],
        "vision_end_token_id": token_ids[VISION_END],
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def preprocessor_config_dict(base: QwenBase = QWEN2_5_VL) -> dict[str, Any]:
    """The base's Qwen2-VL image processor settings, as in its published checkpoints."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": base.processor_class,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": list(base.image_mean),
        "image_std": list(base.image_std),
        "min_pixels": DEFAULT_MIN_PIXELS,
        "max_pixels": DEFAULT_MAX_PIXELS,
        "patch_size": base.patch_size,
        "temporal_patch_size": base.temporal_patch,
        "merge_size": base.merge_size,
    }


def write_tiny_qwen_dir(out_dir: str | Path, spec: TinyQwenSpec = TINY_QWEN, base: QwenBase = QWEN2_5_VL) -> list[Path]:
    """Write the whole tiny Qwen2.5-VL or Qwen3-VL directory (no weights); returns the paths written."""
    out = Path(out_dir)
    written = build_tiny_tokenizer(out, spec, base)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    token_ids = {token: tokenizer.token_to_id(token) for token in QWEN_SPECIAL_TOKENS}
    n_tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    config = (qwen3_config_dict if base is QWEN3_VL else qwen_config_dict)(token_ids, n_tokens, spec)
    written.append(_write_json(out / "config.json", config))
    written.append(_write_json(out / "preprocessor_config.json", preprocessor_config_dict(base)))
    return sorted(written)


def write_tiny_vggt_config(path: str | Path) -> Path:
    """Write the tiny VGGT aggregator constructor kwargs as JSON."""
    return _write_json(Path(path), TINY_VGGT_AGGREGATOR)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny Qwen directory and the tiny VGGT config.")
    parser.add_argument("qwen_dir", type=Path, help="directory for config, tokenizer and processor files")
    parser.add_argument("--base", choices=sorted(BASES), default=QWEN2_5_VL.model_type, help="the base model")
    parser.add_argument("--vggt-config", type=Path, default=None, help="also write the tiny VGGT config here")
    args = parser.parse_args(argv)
    for path in write_tiny_qwen_dir(args.qwen_dir, base=BASES[args.base]):
        print(path)
    if args.vggt_config is not None:
        print(write_tiny_vggt_config(args.vggt_config))


if __name__ == "__main__":
    main()
