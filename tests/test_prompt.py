"""The training prompt: Qwen2.5-VL chat format, supervision only on the answer, four segments,
the right number of image pads per image, and fast per-sample building."""

from __future__ import annotations

import pytest
import torch
from model_cases import QWEN_DIR, VISUAL_TOKENS, builder, tiny_tokenizer
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from janus_cache.index import ACTIONS, DatasetIndex, Sample
from janus_train.prompt import (
    ACTIONS_TEXT,
    ANSWER_LABELS,
    ANSWER_TEXT,
    CURRENT_TEXT,
    HISTORY_TEXT,
    IGNORE_INDEX,
    IMAGE_PAD,
    ROLE_TEXT,
    TASK_TEXT,
    EncodedPrompt,
    PromptBuilder,
    PromptError,
    collate_prompts,
)


def answer_lines(sample: Sample) -> str:
    return "\n".join(
        f"{label} {value}"
        for label, value in zip(
            ANSWER_LABELS,
            (sample.subinstruction, sample.description_2d, sample.description_3d, sample.action),
            strict=True,
        )
    )


def chat_template_ids(sample: Sample, visual_tokens: list[int]) -> list[int]:
    """The ids the Qwen chat template gives for the same conversation, pads expanded by hand as
    Qwen's processor does (one <|image_pad|> per visual token)."""
    tokenizer = tiny_tokenizer()
    *history, current = [{"type": "image"} for _ in visual_tokens]
    content = (
        [{"type": "text", "text": f"{ROLE_TEXT} {HISTORY_TEXT}\n"}]
        + history
        + [{"type": "text", "text": f"\n{CURRENT_TEXT}\n"}, current]
        + [{"type": "text", "text": f"\n{TASK_TEXT} {sample.instruction}\n{ANSWER_TEXT} {ACTIONS_TEXT}"}]
    )
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": answer_lines(sample)}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    pieces = text.split(IMAGE_PAD)
    assert len(pieces) == len(visual_tokens) + 1
    expanded = pieces[0] + "".join(IMAGE_PAD * n + piece for n, piece in zip(visual_tokens, pieces[1:], strict=True))
    return tokenizer(expanded, add_special_tokens=False)["input_ids"]


def decode(ids: torch.Tensor) -> str:
    return tiny_tokenizer().decode(ids.tolist())


@pytest.fixture(scope="module")
def samples(sample_index: DatasetIndex) -> list[Sample]:
    """Samples with padded (j <= 8) and linspace (j > 8) windows, every action in the data."""
    return [s for s in sample_index.samples if s.episode_id == sample_index.episodes[0].episode_id]


def test_prompt_equals_the_qwen_chat_template_tokenised_as_a_whole(samples: list[Sample]) -> None:
    """Building from cached pieces gives exactly the ids of the chat-template text tokenised in one go."""
    for sample in samples:
        encoded = builder().build_sample(sample)
        assert encoded.input_ids.tolist() == chat_template_ids(sample, [VISUAL_TOKENS] * len(sample.window))
        assert encoded.input_ids.dtype == torch.int64


def test_labels_supervise_exactly_the_answer_through_im_end(samples: list[Sample]) -> None:
    for sample in samples:
        p = builder().build_sample(sample)
        supervised = (p.labels != IGNORE_INDEX).nonzero().flatten()
        first, last = int(supervised[0]), int(supervised[-1])
        # One contiguous run, labels equal to the inputs there.
        assert supervised.tolist() == list(range(first, last + 1))
        assert torch.equal(p.labels[first : last + 1], p.input_ids[first : last + 1])
        assert decode(p.input_ids[first : last + 1]) == answer_lines(sample) + "<|im_end|>"
        assert decode(p.input_ids[:first]).endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert decode(p.input_ids[last + 1 :]) == "\n"


def test_segments_are_the_four_answer_lines_in_order(samples: list[Sample]) -> None:
    sample = samples[-1]
    p = builder().build_sample(sample)
    values = (sample.subinstruction, sample.description_2d, sample.description_3d, sample.action)
    supervised = p.labels != IGNORE_INDEX
    assert torch.equal(supervised, p.segment_ids > 0)
    # Non-decreasing over the answer: four contiguous segments 1, 2, 3, 4.
    seg = p.segment_ids[supervised]
    assert seg.unique_consecutive().tolist() == [1, 2, 3, 4]
    for k, (label, value) in enumerate(zip(ANSWER_LABELS, values, strict=True), start=1):
        ending = "<|im_end|>" if k == 4 else "\n"
        assert decode(p.input_ids[p.segment_ids == k]) == f"{label} {value}{ending}"


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
    assert custom.build_sample(samples[3]).input_ids.tolist() == chat_template_ids(samples[3], per_image)


def test_action_position_is_the_last_prompt_token(samples: list[Sample]) -> None:
    for sample in samples:
        p = builder().build_sample(sample)
        first_supervised = int((p.labels != IGNORE_INDEX).nonzero()[0])
        assert p.action_position == first_supervised - 1
        assert decode(p.input_ids[: p.action_position + 1]).endswith("<|im_start|>assistant\n")
        assert decode(p.input_ids[p.action_position : p.action_position + 1]) == "\n"
        assert p.action_id == ACTIONS.index(sample.action)


def test_history_images_precede_the_current_view_in_the_user_turn(samples: list[Sample]) -> None:
    text = decode(builder().build_sample(samples[0]).input_ids)
    history_at, current_at, task_at = text.index(HISTORY_TEXT), text.index(CURRENT_TEXT), text.index(TASK_TEXT)
    assert history_at < current_at < task_at
    assert text[history_at:current_at].count("<|vision_start|>") == 8
    assert text[current_at:task_at].count("<|vision_start|>") == 1
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert f"{TASK_TEXT} {samples[0].instruction}\n" in text


def test_single_image_window_has_no_history_sentence(samples: list[Sample]) -> None:
    sample = samples[0]
    p = builder().build(
        sample.instruction,
        sample.subinstruction,
        sample.description_2d,
        sample.description_3d,
        sample.action,
        n_images=1,
    )
    text = decode(p.input_ids)
    assert HISTORY_TEXT not in text and text.count("<|vision_start|>") == 1
    whole = tiny_tokenizer()(
        builder().render_text(
            sample.instruction, sample.subinstruction, sample.description_2d, sample.description_3d, sample.action, 1
        ),
        add_special_tokens=False,
    )["input_ids"]
    assert p.input_ids.tolist() == whole


def test_values_are_kept_on_one_line_and_actions_accept_codes() -> None:
    p = builder().build("Go.\nThen stop.", "  Walk\r\non. ", "A wall.", "Near.", 2, n_images=2)
    text = decode(p.input_ids)
    assert "Your task is to: Go. Then stop.\n" in text
    assert "SUBINSTRUCTION: Walk on.\n2D_DESCRIPTION: A wall.\n" in text
    assert text.endswith(f"ACTION: {ACTIONS[2]}<|im_end|>\n")
    assert p.action_id == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("Go.", "", "A wall.", "Near.", "STOP"), "sample ep/3: subinstruction is empty"),
        (("Go.", "Walk.", "   ", "Near.", "STOP"), "sample ep/3: 2D description is empty"),
        (("Go.", "Walk.", "A wall.", None, "STOP"), "sample ep/3: 3D description must be a string"),
        (("Go.", "Walk.", "A wall.", "Near.", "JUMP"), "sample ep/3: unknown action 'JUMP'"),
        (("Go.", "Walk.", "A wall.", "Near.", 7), "sample ep/3: unknown action 7"),
    ],
)
def test_bad_sample_fields_are_named_in_the_error(args: tuple, message: str) -> None:
    with pytest.raises(PromptError, match=message):
        builder().build(*args, n_images=9, key="ep/3")


def test_per_image_counts_fix_the_number_of_images() -> None:
    b = PromptBuilder(tiny_tokenizer(), [4, 4, 4])
    with pytest.raises(PromptError, match="made for 3 images per sample, got 9"):
        b.build("Go.", "Walk.", "A wall.", "Near.", "STOP", n_images=9)
    with pytest.raises(PromptError, match=">= 1"):
        PromptBuilder(tiny_tokenizer(), 0)


def test_only_the_variable_texts_are_tokenised_per_sample(samples: list[Sample]) -> None:
    """Fixed template parts are tokenised at construction; a sample costs one batched call."""

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
    counting.calls, counting.texts = 0, []
    for sample in samples[:5]:
        b.build_sample(sample)
    assert counting.calls == 5
    assert len(counting.texts) == 5 * 4  # instruction, subinstruction, 2D and 3D description
    assert all(ANSWER_TEXT not in text and IMAGE_PAD not in text for text in counting.texts)


def test_a_tokenizer_that_splits_the_template_differently_is_refused() -> None:
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
    for row, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        assert torch.equal(batch["input_ids"][row, :n], p.input_ids)
        assert torch.equal(batch["labels"][row, :n], p.labels)
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert (batch["input_ids"][row, n:] == pad_id).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
        assert (batch["segment_ids"][row, n:] == 0).all() and (batch["mm_token_type_ids"][row, n:] == 0).all()
    assert batch["action_positions"].tolist() == [p.action_position for p in prompts]
    assert batch["action_ids"].tolist() == [p.action_id for p in prompts]
    assert torch.equal(collate_prompts(prompts, pad_id)["input_ids"], batch["input_ids"])
    with pytest.raises(PromptError, match="empty micro-batch"):
        collate_prompts([], pad_id)
