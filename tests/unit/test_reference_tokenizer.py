"""The tokenizer and preprocessor files of a ``--format janusvln`` export load in the reference's
transformers 4.50.

The tiny Qwen folder was saved by transformers 5: copied as it is, 4.50 loads none of it (fast and
``AutoProcessor``: its ``extra_special_tokens`` is a list, 4.50 calls ``.keys()`` on it; slow: no
``vocab.json`` / ``merges.txt``; image processor: no ``min_pixels`` / ``max_pixels``, so 4.50 uses
its defaults whatever ``size`` says). 4.50 is not installed here, so each requirement of its
loaders (transformers v4.50.0: ``PreTrainedTokenizerBase.__init__``, ``Qwen2Tokenizer.__init__``,
``Qwen2VLImageProcessor.__init__``, ``ProcessorMixin.get_processor_dict``) is pinned as a check of
the written files, and the files are checked to mean what the source folder means: the same
token ids (fast file, and the slow tokenizer's vocab + merges), the same chat template, the same
pixel settings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import BPE
from transformers import AutoImageProcessor, AutoTokenizer

from helpers.model_cases import QWEN_DIR
from janus_core.profile import LanguageModelSettings
from janus_train.checkpoint.reference import reference_config_dict, write_reference_checkpoint
from janus_train.checkpoint.reference_tokenizer import TokenizerExportError, write_reference_tokenizer
from janus_train.model.janus_model import JanusModelConfig, JanusVLNModel, load_qwen
from janus_train.model.loss import LossConfig

TEXTS = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n",
    "You are a visual language navigation model, and your should go to the locations.\nACTION: TURN_LEFT",
    "  spaces   and\ttabs\n\nnewlines 123 4567 ünïcödé 中文 😀 <|vision_start|><|image_pad|><|vision_end|>",
    "SUBINSTRUCTION: walk past the sofa.\n2D_DESCRIPTION: a room\n3D_DESCRIPTION: far\nACTION: STOP",
)
# What 4.50's Qwen2Tokenizer(Fast) and PreTrainedTokenizerBase take from tokenizer_config.json.
TOKENIZER_CONFIG_KEYS_4_50 = {
    "add_bos_token", "add_prefix_space", "added_tokens_decoder", "additional_special_tokens", "bos_token",
    "chat_template", "clean_up_tokenization_spaces", "eos_token", "errors", "extra_special_tokens",
    "model_max_length", "pad_token", "split_special_tokens", "tokenizer_class", "unk_token",
}
ADDED_TOKEN_FIELDS = {"content", "lstrip", "normalized", "rstrip", "single_word", "special"}


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def problems_for_4_50(directory: Path) -> list[str]:
    """What transformers 4.50 fails on (or silently misreads) in a tokenizer/preprocessor folder."""
    problems = []
    config = read(directory / "tokenizer_config.json")
    if not isinstance(config.get("extra_special_tokens", {}), dict):
        problems.append("extra_special_tokens is not a dict (4.50 calls .keys() on it)")
    if config.get("tokenizer_class") not in ("Qwen2Tokenizer", "Qwen2TokenizerFast"):
        problems.append(f"tokenizer_class {config.get('tokenizer_class')!r}")
    if "added_tokens_decoder" not in config:
        problems.append("no added_tokens_decoder")
    if set(config) - TOKENIZER_CONFIG_KEYS_4_50:
        problems.append(f"keys 4.50 does not know: {sorted(set(config) - TOKENIZER_CONFIG_KEYS_4_50)}")
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
        if not (directory / name).is_file():
            problems.append(f"no {name} (the slow Qwen2Tokenizer opens vocab.json and merges.txt)")
    if (directory / "merges.txt").is_file():
        lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
        if not lines[0].startswith("#version:") or any(len(line.split()) != 2 for line in lines[1:] if line):
            problems.append("merges.txt is not '#version' + one 'a b' pair a line")
    # 4.50's processor reads chat_template.jinja or chat_template.json, its tokenizer those or the config's entry.
    if not any((directory / name).is_file() for name in ("chat_template.json", "chat_template.jinja")):
        problems.append("no chat template file for the processor")
    image = read(directory / "preprocessor_config.json")
    if image.get("image_processor_type") != "Qwen2VLImageProcessor":
        problems.append(f"image_processor_type {image.get('image_processor_type')!r}")
    if image.get("processor_class") != "Qwen2_5_VLProcessor":
        problems.append(f"processor_class {image.get('processor_class')!r}")
    for name in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "image_mean",
                 "image_std"):
        if name not in image:
            problems.append(f"preprocessor_config.json has no {name}")
    return problems


def transformers_5_folder(path: Path) -> Path:
    """The tiny Qwen folder as transformers 5's save_pretrained writes it (size only, no min/max_pixels)."""
    shutil.copytree(QWEN_DIR, path)
    AutoImageProcessor.from_pretrained(QWEN_DIR).save_pretrained(path)
    AutoTokenizer.from_pretrained(QWEN_DIR).save_pretrained(path)
    assert "min_pixels" not in read(path / "preprocessor_config.json")
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``write_reference_checkpoint`` directory of the tiny model (tokenizer from the tiny folder)."""
    qwen = load_qwen(LanguageModelSettings(path=QWEN_DIR, random_init=True, seed=0))
    model = JanusVLNModel(qwen, 128, JanusModelConfig())
    config = reference_config_dict(qwen.config, model.config, "last", LossConfig(), "float32")
    return write_reference_checkpoint(tmp_path_factory.mktemp("export") / "janusvln", model.state_dict(), {}, config,
                                      QWEN_DIR, torch.float32)


def test_the_transformers_5_folder_itself_fails_4_50s_requirements() -> None:
    """What the export copied before: the checks below do catch a folder 4.50 cannot load."""
    problems = problems_for_4_50(QWEN_DIR)
    assert any("extra_special_tokens" in p for p in problems) and any("no vocab.json" in p for p in problems)


def test_the_export_meets_every_requirement_of_4_50s_loaders(exported: Path) -> None:
    assert problems_for_4_50(exported) == []


def test_tokenizer_config_holds_the_added_tokens_and_special_tokens_4_50_builds_from(exported: Path) -> None:
    config = read(exported / "tokenizer_config.json")
    added = read(QWEN_DIR / "tokenizer.json")["added_tokens"]
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    assert set(config["added_tokens_decoder"]) == {str(token["id"]) for token in added}
    for token in added:
        entry = config["added_tokens_decoder"][str(token["id"])]
        assert set(entry) == ADDED_TOKEN_FIELDS and entry == {k: token[k] for k in ADDED_TOKEN_FIELDS}
    assert config["additional_special_tokens"] == read(QWEN_DIR / "tokenizer_config.json")["extra_special_tokens"]
    assert "extra_special_tokens" not in config
    # Null special tokens stay null (4.50's Qwen2Tokenizer would default unk_token to <|endoftext|>).
    assert config["unk_token"] is None and config["bos_token"] is None
    assert (config["eos_token"], config["pad_token"]) == ("<|im_end|>", "<|endoftext|>")
    template = (QWEN_DIR / "chat_template.jinja").read_text()
    assert config["chat_template"] == template
    assert read(exported / "chat_template.json") == {"chat_template": template}


def test_vocab_and_merges_give_the_slow_tokenizer_the_same_tokens(exported: Path) -> None:
    """The slow tokenizer's files hold the BPE of tokenizer.json: a tokenizer whose model is built
    from them alone (merges parsed as 4.50 parses them) gives the same ids on every text."""
    fast = Tokenizer.from_file(str(QWEN_DIR / "tokenizer.json"))
    vocab = read(exported / "vocab.json")
    lines = (exported / "merges.txt").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split()) for i, line in enumerate(lines) if line and not (i == 0 and line.startswith("#"))]
    assert vocab == read(QWEN_DIR / "tokenizer.json")["model"]["vocab"] and len(merges) > 1000
    from_files = Tokenizer.from_file(str(QWEN_DIR / "tokenizer.json"))
    from_files.model = BPE(vocab, merges)
    for text in TEXTS:
        assert from_files.encode(text).ids == fast.encode(text).ids, text
    # Ids run without gap over the vocabulary and the added tokens, as 4.50's slow tokenizer assumes.
    ids = set(vocab.values()) | {int(i) for i in read(exported / "tokenizer_config.json")["added_tokens_decoder"]}
    assert ids == set(range(len(ids)))


def test_the_export_tokenizes_and_templates_as_the_source_folder(exported: Path) -> None:
    ours, source = AutoTokenizer.from_pretrained(exported), AutoTokenizer.from_pretrained(QWEN_DIR)
    for text in TEXTS:
        assert ours.encode(text) == source.encode(text), text
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Go to the kitchen."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "ACTION: STOP"}]}]
    assert ours.apply_chat_template(messages, tokenize=False) == source.apply_chat_template(messages, tokenize=False)


def test_preprocessor_config_names_the_pixel_bounds_4_50_reads(tmp_path: Path) -> None:
    """From a folder saved by transformers 5 (bounds in ``size`` only, which 4.50 ignores) the
    export writes min_pixels / max_pixels; every other setting is the source's."""
    source = transformers_5_folder(tmp_path / "qwen")
    out = tmp_path / "out"
    out.mkdir()
    write_reference_tokenizer(source, out)
    image, original = read(out / "preprocessor_config.json"), read(QWEN_DIR / "preprocessor_config.json")
    assert (image["min_pixels"], image["max_pixels"]) == (original["min_pixels"], original["max_pixels"])
    assert image["size"] == {"shortest_edge": original["min_pixels"], "longest_edge": original["max_pixels"]}
    for name in ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "rescale_factor"):
        assert image[name] == original[name], name
    assert problems_for_4_50(out) == []


def test_a_folder_in_4_50_form_comes_out_with_the_same_files(exported: Path, tmp_path: Path) -> None:
    """A released Qwen2.5-VL folder (4.x form: template in the config and chat_template.json, vocab
    and merges present): written again, nothing changes."""
    again = tmp_path / "again"
    again.mkdir()
    written = write_reference_tokenizer(exported, again)
    assert {p.name for p in written} == {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                                         "chat_template.json", "preprocessor_config.json"}
    for path in written:
        assert path.read_bytes() == (exported / path.name).read_bytes(), path.name


@pytest.mark.parametrize("missing", ["tokenizer.json", "preprocessor_config.json"])
def test_a_folder_without_a_needed_file_is_one_line_naming_it(tmp_path: Path, missing: str) -> None:
    source = tmp_path / "qwen"
    shutil.copytree(QWEN_DIR, source)
    (source / missing).unlink()
    with pytest.raises(TokenizerExportError) as err:
        write_reference_tokenizer(source, tmp_path)
    assert str(source) in str(err.value) and missing in str(err.value) and "\n" not in str(err.value)
