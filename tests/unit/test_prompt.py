"""The training sample, token for token as the reference JanusVLN trainer builds it
(docs/train.md "The training sample"): the exact user and target texts, labels through the closing
``<|im_end|>\\n``, per-token loss weights, segment ids, the action-head position, and janus's own
wording as an opt-in template; on each base, the conversation its chat template gives and the
sample ``show-sample`` shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from helpers.bases import QWEN3, BaseCase
from helpers.model_cases import QWEN_DIR, VISUAL_TOKENS, builder, tiny_tokenizer
from janus_core.bases import base_of_qwen_dir
from janus_core.imaging import load_qwen_frame
from janus_core.index import ACTIONS, DatasetIndex, Sample
from janus_core.profile import load_profile
from janus_train.build import prompt_builder
from janus_train.data.prompt import (
    ACTIONS_TEXT,
    IGNORE_INDEX,
    IMAGE_PAD,
    EncodedPrompt,
    PromptBuilder,
    PromptError,
    PromptFields,
    collate_prompts,
)
from janus_train.data.prompt_template import PromptTemplate, TemplateError
from janus_train.data.sample_view import describe_sample
from pipelines.train_cli import show_sample_cmd

# The reference's user text, copied from docs/train.md "The training sample" ({H}: one <image> per history image).
REFERENCE_USER = (
    "You are a visual language navigation model, and your should go to the locations to complete the given task. "
    "Compare the observation and instruction to infer your current progress, and then select the correct direction "
    "from the candidates to go to the target location and finish the task.\n"
    "This is your historical observation:{H}\n"
    "This is your current observation:<image>\n"
    "Your task is to {instruction}\n"
    "First, predict the subinstruction for the current view. Then describe the view in 2D and 3D. "
    "Finally, choose one of the following actions:\nMOVE_FORWARD\nTURN_LEFT\nTURN_RIGHT\nSTOP.\n"
    "Respond in the following format:\nSUBINSTRUCTION: ...\n2D_DESCRIPTION: ...\n3D_DESCRIPTION: ...\nACTION: ..."
)
# janus's own wording before it followed the reference (configs/prompts/janus.yaml).
JANUS_ROLE = "You are a visual language navigation agent in an indoor environment."
JANUS_HISTORY = "These are your historical observations, from the oldest to the newest:"
JANUS_QUESTION = (
    "Answer with four lines: the current subinstruction, a 2D description of the view, "
    "a 3D description of the scene, and the next action. " + ACTIONS_TEXT
)


def target_text(sample: Sample) -> str:
    return (
        f"SUBINSTRUCTION: {sample.subinstruction}\n2D_DESCRIPTION: {sample.description_2d}\n"
        f"3D_DESCRIPTION: {sample.description_3d}\nACTION: {sample.action}"
    )


def reference_ids(user: str, target: str, visual_tokens: list[int]) -> list[int]:
    """The reference conversation tokenised as one text, each <image> expanded to its pads."""
    pieces = user.split("<image>")
    assert len(pieces) == len(visual_tokens) + 1
    user = pieces[0] + "".join(
        f"<|vision_start|>{IMAGE_PAD * n}<|vision_end|>{piece}"
        for n, piece in zip(visual_tokens, pieces[1:], strict=True)
    )
    text = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{target}<|im_end|>\n"
    )
    return tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]


def decode(ids: torch.Tensor) -> str:
    return tiny_tokenizer().decode(ids.tolist())


def supervised_span(p: EncodedPrompt) -> tuple[int, int]:
    positions = (p.labels != IGNORE_INDEX).nonzero().flatten()
    return int(positions[0]), int(positions[-1])


@pytest.fixture(scope="module")
def samples(sample_index: DatasetIndex) -> list[Sample]:
    """Samples with padded (j <= 8) and linspace (j > 8) windows, every action in the data."""
    return [s for s in sample_index.samples if s.episode_id == sample_index.episodes[0].episode_id]


def test_user_and_target_texts_are_the_reference_texts_exactly(samples: list[Sample]) -> None:
    for sample in samples:
        texts = builder().sample_texts(sample)
        history = "<image>" * (len(sample.window) - 1)
        assert texts.user == REFERENCE_USER.format(H=history, instruction=sample.instruction)
        assert texts.target == target_text(sample)


def test_ids_are_the_reference_conversation_tokenised_as_a_whole(samples: list[Sample]) -> None:
    for sample in samples:
        encoded = builder().build_sample(sample)
        user = REFERENCE_USER.format(H="<image>" * (len(sample.window) - 1), instruction=sample.instruction)
        assert encoded.input_ids.tolist() == reference_ids(user, target_text(sample), [VISUAL_TOKENS] * 9)
        assert encoded.input_ids.dtype == torch.int64


def test_labels_cover_the_assistant_turn_after_its_header_through_the_closing_newline(
    samples: list[Sample],
) -> None:
    header = tiny_tokenizer()("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    for sample in samples:
        p = builder().build_sample(sample)
        first, last = supervised_span(p)
        # One contiguous run to the very end, labels equal to the inputs there.
        assert last == len(p) - 1 and int((p.labels != IGNORE_INDEX).sum()) == len(p) - first
        assert torch.equal(p.labels[first:], p.input_ids[first:])
        assert p.input_ids[first - len(header) : first].tolist() == header
        assert decode(p.input_ids[first:]) == target_text(sample) + "<|im_end|>\n"
        assert decode(p.input_ids[:first]).endswith("ACTION: ...<|im_end|>\n<|im_start|>assistant\n")


def test_closing_tokens_weigh_one_whatever_the_segment_weights(samples: list[Sample]) -> None:
    sample = samples[-1]
    p = PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS, segment_weights=(1.0, 1.0, 1.0, 3.0)).build_sample(sample)
    first, _ = supervised_span(p)
    weights = p.loss_weights[first:].tolist()
    assert decode(p.input_ids[-2:]) == "<|im_end|>\n" and weights[-2:] == [1.0, 1.0]
    assert decode(p.input_ids[p.loss_weights == 3.0]) == f"ACTION: {sample.action}"
    lines_1_to_3 = target_text(sample).rsplit("\n", 1)[0] + "\n"
    assert decode(p.input_ids[first:][torch.tensor(weights) == 1.0][:-2]) == lines_1_to_3
    assert (p.loss_weights[:first] == 0).all() and p.loss_weights.dtype == torch.float32


def test_each_target_line_weighs_its_segment_weight_newline_included(samples: list[Sample]) -> None:
    sample = samples[2]
    p = PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS, segment_weights=(0.5, 2.0, 4.0, 3.0)).build_sample(sample)
    lines = target_text(sample).split("\n")
    for weight, line in zip((0.5, 2.0, 4.0), lines[:3], strict=True):
        assert decode(p.input_ids[p.loss_weights == weight]) == line + "\n"
    assert decode(p.input_ids[p.loss_weights == 3.0]) == lines[3]
    assert decode(p.input_ids[p.loss_weights == 1.0]) == "<|im_end|>\n"


def test_segments_run_from_marker_to_marker_and_the_last_to_the_end(samples: list[Sample]) -> None:
    sample = samples[-1]
    p = PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS, segment_weights=(1.0, 1.0, 1.0, 3.0)).build_sample(sample)
    assert torch.equal(p.labels != IGNORE_INDEX, p.segment_ids > 0)
    assert p.segment_ids[p.segment_ids > 0].unique_consecutive().tolist() == [1, 2, 3, 4]
    lines = target_text(sample).split("\n")
    for k in (1, 2, 3):
        assert decode(p.input_ids[p.segment_ids == k]) == lines[k - 1] + "\n"
    assert decode(p.input_ids[p.segment_ids == 4]) == lines[3] + "<|im_end|>\n"


def test_the_action_head_reads_the_position_before_the_first_supervised_token(samples: list[Sample]) -> None:
    for sample in samples:
        p = builder().build_sample(sample)
        first, _ = supervised_span(p)
        assert p.action_position == first - 1
        assert decode(p.input_ids[: p.action_position + 1]).endswith("<|im_start|>assistant\n")
        assert decode(p.input_ids[p.action_position : p.action_position + 1]) == "\n"
        assert p.action_id == ACTIONS.index(sample.action)
    assert ACTIONS == ("STOP", "MOVE_FORWARD", "TURN_LEFT", "TURN_RIGHT")  # the reference's action-head ids


def test_texts_are_stripped_keep_inner_newlines_and_lists_use_their_first_element() -> None:
    fields = PromptFields("  Go to the hall.\nThen stop. ", ["  Walk\non. ", "ignored"], ("A wall.",),
                          "Near\n\nthe door.", 2)
    texts = builder().texts(fields, n_images=2)
    assert texts.user == REFERENCE_USER.format(H="<image>", instruction="Go to the hall.\nThen stop.")
    assert texts.target == (
        "SUBINSTRUCTION: Walk\non.\n2D_DESCRIPTION: A wall.\n3D_DESCRIPTION: Near\n\nthe door.\nACTION: TURN_LEFT"
    )
    p = builder().build(fields, n_images=2)
    first, _ = supervised_span(p)
    assert decode(p.input_ids[first:]) == texts.target + "<|im_end|>\n"
    assert decode(p.input_ids[p.segment_ids == 1]) == "SUBINSTRUCTION: Walk\non.\n"
    assert decode(p.input_ids[p.segment_ids == 3]) == "3D_DESCRIPTION: Near\n\nthe door.\n"
    assert p.action_id == 2


def test_each_image_is_vision_start_n_pads_vision_end(samples: list[Sample]) -> None:
    tokenizer = tiny_tokenizer()
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    start = tokenizer.convert_tokens_to_ids("<|vision_start|>")
    end = tokenizer.convert_tokens_to_ids("<|vision_end|>")
    per_image = [4, 4, 9, 4, 1, 4, 4, 4, 16]
    custom = PromptBuilder(tokenizer, per_image)
    for b, counts in ((builder(), [VISUAL_TOKENS] * 9), (custom, per_image)):
        p = b.build_sample(samples[3])
        ids = p.input_ids.tolist()
        starts = [i for i, t in enumerate(ids) if t == start]
        ends = [i for i, t in enumerate(ids) if t == end]
        assert [e - s - 1 for s, e in zip(starts, ends, strict=True)] == counts
        for s, e in zip(starts, ends, strict=True):
            assert set(ids[s + 1 : e]) == {pad}
        assert p.visual_tokens == tuple(counts)
        assert torch.equal(p.mm_token_type_ids, (p.input_ids == pad).long())
        assert int(p.mm_token_type_ids.sum()) == sum(counts)
    user = custom.sample_texts(samples[3]).user
    assert custom.build_sample(samples[3]).input_ids.tolist() == reference_ids(user, target_text(samples[3]), per_image)


def test_history_images_follow_each_other_without_separator(samples: list[Sample]) -> None:
    text = decode(builder().build_sample(samples[0]).input_ids)
    block = f"<|vision_start|>{IMAGE_PAD * VISUAL_TOKENS}<|vision_end|>"
    assert f"This is your historical observation:{block * 8}\nThis is your current observation:{block}\n" in text
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")


def test_janus_wording_is_an_opt_in_template_with_the_same_supervision(samples: list[Sample]) -> None:
    janus = PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS, template=PromptTemplate.load("janus.yaml"))
    sample = samples[0]
    texts = janus.sample_texts(sample)
    assert texts.user == (
        f"{JANUS_ROLE} {JANUS_HISTORY}\n{'<image>' * 8}\nThis is your current observation:\n<image>\n"
        f"Your task is to: {sample.instruction}\n{JANUS_QUESTION}"
    )
    assert texts.target == target_text(sample)
    p = janus.build_sample(sample)
    assert p.input_ids.tolist() == reference_ids(texts.user, texts.target, [VISUAL_TOKENS] * 9)
    first, _ = supervised_span(p)
    assert decode(p.input_ids[first:]) == target_text(sample) + "<|im_end|>\n"
    # Without history the janus wording drops its history sentence.
    alone = janus.texts(PromptFields(sample.instruction, "Walk.", "A wall.", "Near.", "STOP"), n_images=1).user
    assert alone == (f"{JANUS_ROLE}\nThis is your current observation:\n<image>\n"
                     f"Your task is to: {sample.instruction}\n{JANUS_QUESTION}")
    go = PromptFields("Go.", "Walk.", "A wall.", "Near.", "STOP")
    assert builder().texts(go, n_images=1).user == REFERENCE_USER.format(H="", instruction="Go.")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("user: 'Look at {current}.'\n", r"t.yaml: 'user' needs the placeholder \{instruction\}"),
        ("user: '{history}{current}{instruction}{goal}'\n", r"t.yaml: a user text has an unknown placeholder"),
        ("sytem: x\n", r"t.yaml: unknown setting 'sytem' \(did you mean 'system'\?\)"),
        ("system: x\n", r"t.yaml: missing setting 'user'"),
    ],
)
def test_a_wrong_template_file_is_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "t.yaml").write_text(text)
    with pytest.raises(TemplateError, match=message):
        PromptTemplate.load(tmp_path / "t.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("Go.", "", "A wall.", "Near.", "STOP"), "sample ep/3: subinstruction is empty"),
        (("Go.", "Walk.", "   ", "Near.", "STOP"), "sample ep/3: 2D description is empty"),
        (("Go.", "Walk.", "A wall.", None, "STOP"), "sample ep/3: 3D description must be a string"),
        (("Go.", [], "A wall.", "Near.", "STOP"), "sample ep/3: subinstruction is an empty list"),
        (("Go <image> there.", "Walk.", "A wall.", "Near.", "STOP"), "sample ep/3: the user turn holds 10 images"),
        (("Go.", "Walk.", "A wall.", "Near.", "JUMP"), "sample ep/3: unknown action 'JUMP'"),
        (("Go.", "Walk.", "A wall.", "Near.", 7), "sample ep/3: unknown action 7"),
    ],
)
def test_bad_sample_fields_are_named_in_the_error(args: tuple, message: str) -> None:
    with pytest.raises(PromptError, match=message):
        builder().build(PromptFields(*args), n_images=9, key="ep/3")


def test_builder_settings_are_checked() -> None:
    b = PromptBuilder(tiny_tokenizer(), [4, 4, 4])
    with pytest.raises(PromptError, match="made for 3 images per sample, got 9"):
        b.build(PromptFields("Go.", "Walk.", "A wall.", "Near.", "STOP"), n_images=9)
    with pytest.raises(PromptError, match=">= 1"):
        PromptBuilder(tiny_tokenizer(), 0)
    with pytest.raises(PromptError, match=r"segment_weights needs 4 numbers > 0"):
        PromptBuilder(tiny_tokenizer(), 4, segment_weights=(1.0, 0.0, 1.0, 3.0))


def test_a_sample_costs_one_batched_tokenizer_call(samples: list[Sample]) -> None:
    """The question after its last image, the target and its three growing prefixes; the question
    up to its last image is tokenised once per window length."""

    class CountingTokenizer:
        def __init__(self, inner: object) -> None:
            self.inner, self.calls, self.texts = inner, 0, []

        def __call__(self, text: str | list[str], **kwargs: object) -> object:
            self.calls += 1
            self.texts.extend([text] if isinstance(text, str) else text)
            return self.inner(text, **kwargs)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    counting = CountingTokenizer(tiny_tokenizer())
    b = PromptBuilder(counting, VISUAL_TOKENS)
    b.build_sample(samples[0])  # the first sample of a window length tokenises its head once
    counting.calls, counting.texts = 0, []
    for sample in samples[1:6]:
        b.build_sample(sample)
    assert counting.calls == 5 and len(counting.texts) == 5 * 5
    assert all(IMAGE_PAD not in text and "This is your historical observation" not in text for text in counting.texts)


def test_a_tokenizer_that_splits_the_conversation_differently_is_refused() -> None:
    tokenizer = AutoTokenizer.from_pretrained(QWEN_DIR)
    # A GPT-2 style pre-tokenizer adds a space before every piece: piecewise ids would differ.
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    with pytest.raises(PromptError, match="differently in pieces than as a whole"):
        PromptBuilder(tokenizer, VISUAL_TOKENS)


def test_collate_right_pads_with_the_tokenizer_pad_id(samples: list[Sample]) -> None:
    prompts: list[EncodedPrompt] = [builder().build_sample(s) for s in (samples[0], samples[-1])]
    lengths = [len(p) for p in prompts]
    assert lengths[0] != lengths[1]
    batch = builder().collate(prompts)
    width = max(lengths)
    pad_id = tiny_tokenizer().pad_token_id
    assert builder().pad_token_id == pad_id
    for name in ("input_ids", "attention_mask", "labels", "segment_ids", "mm_token_type_ids"):
        assert batch[name].shape == (2, width) and batch[name].dtype == torch.int64
    assert batch["loss_weights"].shape == (2, width) and batch["loss_weights"].dtype == torch.float32
    for row, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        assert torch.equal(batch["input_ids"][row, :n], p.input_ids)
        assert torch.equal(batch["labels"][row, :n], p.labels)
        assert torch.equal(batch["loss_weights"][row, :n], p.loss_weights)
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert (batch["input_ids"][row, n:] == pad_id).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all() and (batch["loss_weights"][row, n:] == 0).all()
        assert (batch["segment_ids"][row, n:] == 0).all() and (batch["mm_token_type_ids"][row, n:] == 0).all()
    assert batch["action_positions"].tolist() == [p.action_position for p in prompts]
    assert batch["action_ids"].tolist() == [p.action_id for p in prompts]
    assert torch.equal(collate_prompts(prompts, pad_id)["input_ids"], batch["input_ids"])
    with pytest.raises(PromptError, match="empty micro-batch"):
        collate_prompts([], pad_id)


def test_token_sequence_and_label_mask_equal_each_bases_chat_template(base: BaseCase, sample_index: DatasetIndex
                                                                      ) -> None:
    """The conversation through the base's own chat template, each image pad repeated to the
    frame's visual tokens as its processor does; supervised = everything after the template's
    generation prompt (the assistant header)."""
    tokenizer = AutoTokenizer.from_pretrained(base.qwen_dir)
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
        pads = "<|image_pad|>" * VISUAL_TOKENS
        whole = tokenizer.apply_chat_template(messages, tokenize=False).replace("<|image_pad|>", pads)
        prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
        prompt = prompt.replace("<|image_pad|>", pads)
        ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
        n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert encoded.input_ids.tolist() == ids
        assert (encoded.labels != IGNORE_INDEX).tolist() == [i >= n_prompt for i in range(len(ids))]
        assert encoded.labels[n_prompt:].tolist() == ids[n_prompt:]


def test_qwen3_vls_template_adds_no_default_system_turn() -> None:
    """(janus's prompts always carry one.)"""
    bare = [{"role": "user", "content": "hi"}]
    tokenizer = AutoTokenizer.from_pretrained(QWEN3.qwen_dir)
    assert tokenizer.apply_chat_template(bare, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_show_sample_prints_texts_counts_and_every_supervised_token(samples: list[Sample]) -> None:
    sample = samples[4]
    b = PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS, segment_weights=(1.0, 1.0, 1.0, 3.0))
    p = b.build_sample(sample)
    first, _ = supervised_span(p)
    lines = describe_sample(b, sample).splitlines()
    assert lines[0] == f"sample {sample.key}"
    assert lines[1] == f"user text: {b.sample_texts(sample).user!r}"
    assert lines[2] == f"target text: {target_text(sample)!r}"
    assert lines[3].startswith(f"tokens: {len(p)} ")
    assert lines[4] == f"supervised tokens: {len(p) - first}"
    assert lines[5] == f"action head: position {first - 1}, action id {ACTIONS.index(sample.action)}"
    rows = lines[7:]
    assert len(rows) == len(p) - first
    assert rows[-2].split() == [str(len(p) - 2), "'<|im_end|>'", "1", "4", "action"]
    assert rows[-1].split() == [str(len(p) - 1), "'\\n'", "1", "4", "action"]
    assert [r.split()[-3] for r in rows if r.split()[-1] == "action"][:-2] == ["3"] * int((p.loss_weights == 3).sum())
    # The command prints this description: tests/e2e/test_prompt_command.py.


def test_show_sample_of_each_bases_profile_gives_each_image_the_tokens_of_its_stored_frame(
    base: BaseCase, sample_index: DatasetIndex, sample_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``janus-train show-sample`` shows the sample as a run of the profile trains it: its visual
    tokens per image are those of the frame a cache of the profile's base stores (Qwen3-VL's own
    frame at the profile's resolution, 32 px per token), and the command prints the description the
    profile's prompt builder gives. (The command's process: tests/e2e/test_prompt_command.py.)"""
    profile = load_profile(base.profile)
    assert base_of_qwen_dir(profile.qwen.path) is base.base
    sample = sample_index.samples[4]
    builder = prompt_builder(profile)

    frame = load_qwen_frame(sample_index.frames[sample.window_rows[-1]].path, profile.cache.resolution, base.base)
    h, w = base.base.token_grid(*frame.shape[:2])
    prompt = builder.build_sample(sample)
    assert int((prompt.input_ids == builder.image_token_id).sum()) == len(sample.window) * h * w

    show_sample_cmd(data=sample_dataset, key=sample.key, profile=base.profile, run=None, overrides=None)
    assert capsys.readouterr().out.rstrip("\n") == describe_sample(builder, sample)
