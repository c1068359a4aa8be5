"""The tokenizer and preprocessor files of a reference checkpoint directory, in the form the
reference's transformers (4.50) reads.

A base-model folder saved by transformers 5 (as the tiny one is) does not load in 4.50, fast, slow
or ``AutoProcessor``: its ``tokenizer_config.json`` lists ``extra_special_tokens`` (4.50 takes a
dict there), it has neither ``vocab.json`` nor ``merges.txt`` (4.50's slow ``Qwen2Tokenizer`` reads
them) nor ``added_tokens_decoder``, and its ``preprocessor_config.json`` keeps the pixel bounds in
``size`` only (4.50's ``Qwen2VLImageProcessor`` ignores ``size`` and reads ``min_pixels`` /
``max_pixels``). So these files are written, not copied: from the folder's ``tokenizer.json`` (the
tokenizer both versions share), its tokenizer config, chat template and image processor config. A
folder already in 4.50 form (a released Qwen2.5-VL) comes out with the same meaning.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
CHAT_TEMPLATE_JSON = "chat_template.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
GENERATION_CONFIG = "generation_config.json"
# The first line of a GPT-2-style merges file (4.50's slow tokenizer skips it).
MERGES_HEADER = "#version: 0.2"
TOKENIZER_CLASS = "Qwen2Tokenizer"
IMAGE_PROCESSOR_TYPE = "Qwen2VLImageProcessor"
PROCESSOR_CLASS = "Qwen2_5_VLProcessor"
# tokenizer_config.json settings that 4.50's Qwen2Tokenizer(Fast) takes, copied when present (a
# null special token is written as null: 4.50 would otherwise default unk_token to <|endoftext|>).
TOKENIZER_SETTINGS: tuple[str, ...] = (
    "add_bos_token", "add_prefix_space", "bos_token", "clean_up_tokenization_spaces", "eos_token", "errors",
    "model_max_length", "pad_token", "split_special_tokens", "unk_token",
)
# Qwen2VLImageProcessor settings of 4.50's constructor, besides min_pixels / max_pixels.
IMAGE_SETTINGS: tuple[str, ...] = (
    "do_resize", "resample", "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std",
    "do_convert_rgb", "patch_size", "temporal_patch_size", "merge_size",
)
# Every file write_reference_tokenizer writes (generation_config.json only when the source has one).
REFERENCE_TOKENIZER_FILES: tuple[str, ...] = (
    TOKENIZER_JSON, TOKENIZER_CONFIG, VOCAB_FILE, MERGES_FILE, CHAT_TEMPLATE_JSON, PREPROCESSOR_CONFIG,
    GENERATION_CONFIG,
)
_ADDED_TOKEN_FIELDS: tuple[str, ...] = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")


class TokenizerExportError(ValueError):
    """A base-model folder whose tokenizer cannot be written in 4.50 form; one line, naming the file."""


@dataclass(frozen=True)
class ReferenceTokenizerFiles:
    """The 4.50 files' contents, before they are written."""

    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    vocab: dict[str, int]
    merges: list[str]
    chat_template: str | list[Any] | None
    preprocessor_config: dict[str, Any]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerExportError(f"{path}: cannot read: {exc}") from exc


def _merges(model: dict[str, Any], source: Path) -> list[str]:
    """``a b`` lines of a BPE model's merges (tokenizers >= 0.20 stores pairs, older ones strings)."""
    lines = []
    for merge in model.get("merges", []):
        pair = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(pair) != 2 or any(not part or " " in part or "\n" in part for part in pair):
            raise TokenizerExportError(f"{source}: merge {merge!r} cannot be written to {MERGES_FILE}")
        lines.append(" ".join(pair))
    return lines


def _chat_template(source: Path, config: dict[str, Any]) -> str | list[Any] | None:
    """The template the folder's loader uses: chat_template.jinja, else chat_template.json, else the
    tokenizer config's entry."""
    if (source / CHAT_TEMPLATE_JINJA).is_file():
        return (source / CHAT_TEMPLATE_JINJA).read_text(encoding="utf-8")
    if (source / CHAT_TEMPLATE_JSON).is_file():
        return _read_json(source / CHAT_TEMPLATE_JSON).get("chat_template")
    return config.get("chat_template")


def _tokenizer_config(config: dict[str, Any], added_tokens: list[dict[str, Any]],
                      chat_template: str | list[Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {name: config[name] for name in TOKENIZER_SETTINGS if name in config}
    # 4.50 builds its added-token table from this (transformers 5 keeps it in tokenizer.json only).
    out["added_tokens_decoder"] = {
        str(token["id"]): {name: token[name] for name in _ADDED_TOKEN_FIELDS if name in token} for token in added_tokens
    }
    # transformers 5 lists the extra special tokens under extra_special_tokens; 4.50 reads that key
    # as a dict of named tokens and the list as additional_special_tokens.
    extra = config.get("additional_special_tokens", config.get("extra_special_tokens"))
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t if isinstance(t, str) else t["content"] for t in extra]
    elif isinstance(extra, dict) and extra:
        out["extra_special_tokens"] = extra
    if chat_template is not None:
        out["chat_template"] = chat_template
    out["tokenizer_class"] = TOKENIZER_CLASS
    return out


def _image_processor_config(source: Path) -> dict[str, Any]:
    """The folder's preprocessor_config.json in 4.50's form. A setting the folder leaves out stays
    out: 4.50's default for it is transformers 5's."""
    path = source / PREPROCESSOR_CONFIG
    if not path.is_file():
        raise TokenizerExportError(f"{source}: no {PREPROCESSOR_CONFIG}; the reference evaluation reads the image "
                                   f"processor from it (set qwen.path to the Qwen2.5-VL folder it came with)")
    settings = _read_json(path)
    size = settings.get("size") or {}
    out: dict[str, Any] = {"image_processor_type": IMAGE_PROCESSOR_TYPE, "processor_class": PROCESSOR_CLASS}
    out.update({name: settings[name] for name in IMAGE_SETTINGS if settings.get(name) is not None})
    # transformers 5 keeps the pixel bounds in ``size`` only; 4.50 ignores a given ``size`` and
    # reads min_pixels / max_pixels: write all three.
    bounds = {"min_pixels": settings.get("min_pixels", size.get("shortest_edge")),
              "max_pixels": settings.get("max_pixels", size.get("longest_edge"))}
    if None not in bounds.values():
        out.update({name: int(value) for name, value in bounds.items()})
        out["size"] = {"shortest_edge": out["min_pixels"], "longest_edge": out["max_pixels"]}
    return out


def reference_tokenizer_files(source: Path) -> ReferenceTokenizerFiles:
    """The 4.50 tokenizer and preprocessor files of the base-model folder ``source`` (``qwen.path``)."""
    source = Path(source)
    tokenizer_file = source / TOKENIZER_JSON
    if not tokenizer_file.is_file():
        raise TokenizerExportError(f"{source}: no {TOKENIZER_JSON}; the reference checkpoint's tokenizer is written "
                                   f"from it (set qwen.path to the Qwen2.5-VL folder it came with)")
    tokenizer_json = tokenizer_file.read_text(encoding="utf-8")
    try:
        tokenizer = json.loads(tokenizer_json)
        model = tokenizer["model"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise TokenizerExportError(f"{tokenizer_file}: not a tokenizers file: {exc}") from exc
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise TokenizerExportError(f"{tokenizer_file}: a Qwen2 tokenizer is byte-level BPE, got model type "
                                   f"{model.get('type')!r}")
    config_file = source / TOKENIZER_CONFIG
    config = _read_json(config_file) if config_file.is_file() else {}
    chat_template = _chat_template(source, config)
    return ReferenceTokenizerFiles(
        tokenizer_json=tokenizer_json,
        tokenizer_config=_tokenizer_config(config, tokenizer.get("added_tokens", []), chat_template),
        vocab=dict(model["vocab"]),
        merges=_merges(model, tokenizer_file),
        chat_template=chat_template,
        preprocessor_config=_image_processor_config(source),
    )


def write_reference_tokenizer(source: Path, out: Path) -> list[Path]:
    """Write the 4.50 tokenizer and preprocessor files of ``source`` into ``out``; the paths written."""
    files = reference_tokenizer_files(source)
    out = Path(out)
    written = {
        TOKENIZER_JSON: files.tokenizer_json,
        TOKENIZER_CONFIG: json.dumps(files.tokenizer_config, indent=2, ensure_ascii=False) + "\n",
        VOCAB_FILE: json.dumps(files.vocab, ensure_ascii=False) + "\n",
        MERGES_FILE: "\n".join([MERGES_HEADER, *files.merges]) + "\n",
        PREPROCESSOR_CONFIG: json.dumps(files.preprocessor_config, indent=2) + "\n",
    }
    if files.chat_template is not None:
        # 4.50's processor reads the template from here (its tokenizer from tokenizer_config.json).
        written[CHAT_TEMPLATE_JSON] = json.dumps({"chat_template": files.chat_template}, indent=2,
                                                 ensure_ascii=False) + "\n"
    paths = []
    for name, text in written.items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    if (Path(source) / GENERATION_CONFIG).is_file():
        paths.append(Path(shutil.copyfile(Path(source) / GENERATION_CONFIG, out / GENERATION_CONFIG)))
    return paths
