"""The training prompt of one sample: token ids, labels, segment ids and the action position.

Layout (Qwen2.5-VL chat format; ``<img>`` = ``<|vision_start|>`` + N x ``<|image_pad|>`` +
``<|vision_end|>`` with N the visual tokens of that image)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n
    <|im_start|>user\\n{ROLE} {HISTORY}\\n<img>...<img>\\n{CURRENT}\\n<img>\\n{TASK} {instruction}\\n
    {ANSWER} {ACTIONS}<|im_end|>\\n
    <|im_start|>assistant\\n
    SUBINSTRUCTION: {subinstruction}\\n2D_DESCRIPTION: {2d}\\n3D_DESCRIPTION: {3d}\\nACTION: {action}<|im_end|>\\n

(with no history images the ``{HISTORY}`` sentence and its images are left out).

Supervision: labels are ``-100`` everywhere except the assistant's answer, which runs from
``SUBINSTRUCTION:`` up to and including the closing ``<|im_end|>`` (so the model learns to write
the labels and to stop); the template's ``<|im_start|>assistant\\n`` and the newline after
``<|im_end|>`` are not supervised. Segment ids (0 outside the answer) split the answer into four
contiguous segments that cover every supervised token exactly once: segment k holds its line label,
its value and the newline ending the line; segment 4 (``ACTION: <name>``) ends with ``<|im_end|>``.
A line's label therefore carries its line's loss weight.

Speed: the fixed parts are tokenised once, at construction; per sample only the instruction and
the three free-text answer values are tokenised, in one batched call of the fast (Rust)
tokenizer, and the pieces are concatenated as numpy arrays. Every variable text is tokenised with
its leading space and trailing newline, and each fixed part before it ends in ``:``; with Qwen2's
pre-tokenizer both are word-piece boundaries, so the ids equal those of tokenising the whole
rendered text at once. The constructor checks that on a probe sample and refuses a tokenizer
that splits differently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from janus_cache.index import ACTIONS, Sample
from janus_cache.qwen_vision import DEFAULT_SYSTEM_PROMPT, IM_END, IM_START, IMAGE_PAD, VISION_END, VISION_START

IGNORE_INDEX = -100
"""Label of positions without loss (the value PyTorch's cross-entropy ignores)."""

SYSTEM_PROMPT = DEFAULT_SYSTEM_PROMPT
ROLE_TEXT = "You are a visual language navigation agent in an indoor environment."
HISTORY_TEXT = "These are your historical observations, from the oldest to the newest:"
CURRENT_TEXT = "This is your current observation:"
TASK_TEXT = "Your task is to:"
ANSWER_TEXT = (
    "Answer with four lines: the current subinstruction, a 2D description of the view, "
    "a 3D description of the scene, and the next action."
)
ACTIONS_TEXT = "The possible actions are " + ", ".join(ACTIONS) + "."

ANSWER_LABELS: tuple[str, ...] = ("SUBINSTRUCTION:", "2D_DESCRIPTION:", "3D_DESCRIPTION:", "ACTION:")
"""Line labels of the four answer lines; line k (1-based) is segment k."""
SEGMENT_NAMES: tuple[str, ...] = ("subinstruction", "description_2d", "description_3d", "action")
N_SEGMENTS = len(ANSWER_LABELS)

# Texts of the probe sample the constructor checks the piecewise tokenisation on: punctuation and
# digits at both ends of every variable text, where a boundary could merge differently.
_PROBE_TEXTS = (
    "Walk past the 2 chairs, then stop.",
    "Turn left at the door.",
    '"Red" wall ahead; 3 doors to the left...',
    "1.5 m to the wall (left side).",
)


class PromptError(ValueError):
    """A sample cannot be turned into a prompt; the message names the sample and the field."""


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    """Token-level tensors of one sample (all int64, length L).

    ``action_position`` is the index of the hidden state just before the first supervised token
    (the last token of ``<|im_start|>assistant\\n``): the action head reads it.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    segment_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    action_position: int
    action_id: int
    visual_tokens: tuple[int, ...]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def _clean(text: Any, field: str, key: str | None) -> str:
    """One line of text: surrounding whitespace stripped, line breaks turned into spaces (a value
    spanning lines would break the four-line answer format)."""
    where = f"sample {key}: " if key is not None else ""
    if not isinstance(text, str):
        raise PromptError(f"{where}{field} must be a string, got {type(text).__name__}")
    cleaned = text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ").strip()
    if not cleaned:
        raise PromptError(f"{where}{field} is empty")
    return cleaned


class PromptBuilder:
    """Builds :class:`EncodedPrompt` s with a Qwen2.5(-VL) tokenizer.

    ``visual_tokens_per_image`` is the number of ``<|image_pad|>`` tokens per image: one int for
    every image (e.g. 529 at pad644), or one int per image of the window (its length is then the
    number of images every sample must have).
    """

    def __init__(self, tokenizer: Any, visual_tokens_per_image: int | Sequence[int]) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise PromptError(f"PromptBuilder needs a fast tokenizer, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        if isinstance(visual_tokens_per_image, int):
            self._per_image: tuple[int, ...] | None = None
            self._uniform = visual_tokens_per_image
            counts: tuple[int, ...] = (visual_tokens_per_image,)
        else:
            self._per_image = tuple(int(n) for n in visual_tokens_per_image)
            self._uniform = 0
            counts = self._per_image
            if not counts:
                raise PromptError("visual_tokens_per_image is an empty sequence")
        if any(n < 1 for n in counts):
            raise PromptError(f"visual tokens per image must be >= 1, got {list(counts)}")

        specials = (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD)
        self.token_ids = {name: self._special_id(name) for name in specials}
        self.image_token_id = self.token_ids[IMAGE_PAD]
        pad = tokenizer.pad_token_id
        if pad is None:
            raise PromptError("the tokenizer has no pad token; set tokenizer.pad_token (Qwen uses <|endoftext|>)")
        self.pad_token_id = int(pad)

        ids = self._ids
        self._head_history = ids(
            f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n{IM_START}user\n{ROLE_TEXT} {HISTORY_TEXT}\n"
        )
        # Without history the role sentence runs straight into the current-view sentence: one piece,
        # since "." + "\n" is a single word piece for Qwen2's pre-tokenizer.
        self._head_no_history = ids(
            f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n{IM_START}user\n{ROLE_TEXT}\n{CURRENT_TEXT}\n"
        )
        self._current = ids(f"\n{CURRENT_TEXT}\n")
        self._task = ids(f"\n{TASK_TEXT}")
        self._question_end = ids(f"{ANSWER_TEXT} {ACTIONS_TEXT}{IM_END}\n{IM_START}assistant\n")
        self._labels = [ids(label) for label in ANSWER_LABELS]
        self._action_values = {action: ids(f" {action}") for action in ACTIONS}
        self._end = ids(IM_END)
        self._newline = ids("\n")
        self._image_blocks: dict[int, np.ndarray] = {}
        self._prefixes: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._check_boundaries()

    # -------------------------------------------------------------------------------- helpers

    def _special_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if token_id is None or (unk is not None and token_id == unk):
            raise PromptError(f"the tokenizer has no {token} token; is it a Qwen2.5-VL tokenizer?")
        return int(token_id)

    def _ids(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    def _image_block(self, n: int) -> np.ndarray:
        block = self._image_blocks.get(n)
        if block is None:
            block = np.full(n + 2, self.image_token_id, dtype=np.int64)
            block[0], block[-1] = self.token_ids[VISION_START], self.token_ids[VISION_END]
            self._image_blocks[n] = block
        return block

    def visual_tokens(self, n_images: int) -> tuple[int, ...]:
        """Image-pad count of each image of a sample with ``n_images`` images."""
        if self._per_image is not None:
            if n_images != len(self._per_image):
                raise PromptError(
                    f"this builder was made for {len(self._per_image)} images per sample, got {n_images}"
                )
            return self._per_image
        if n_images < 1:
            raise PromptError(f"a sample needs at least one image (the current view), got {n_images}")
        return (self._uniform,) * n_images

    def _prefix(self, visual: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Ids and image-token types of everything before the instruction, cached per image layout."""
        cached = self._prefixes.get(visual)
        if cached is None:
            *history, current = visual
            if history:
                parts = [self._head_history, *(self._image_block(n) for n in history), self._current]
            else:
                parts = [self._head_no_history]
            parts += [self._image_block(current), self._task]
            ids = np.concatenate(parts)
            cached = (ids, (ids == self.image_token_id).astype(np.int64))
            self._prefixes[visual] = cached
        return cached

    # ------------------------------------------------------------------------------- building

    def build(
        self,
        instruction: str,
        subinstruction: str,
        description_2d: str,
        description_3d: str,
        action: str | int,
        n_images: int,
        key: str | None = None,
    ) -> EncodedPrompt:
        """Encode one sample; ``key`` (the sample key) only serves error messages."""
        action_id = self._action_id(action, key)
        texts = [
            _clean(instruction, "instruction", key),
            _clean(subinstruction, "subinstruction", key),
            _clean(description_2d, "2D description", key),
            _clean(description_3d, "3D description", key),
        ]
        variable = self.tokenizer([f" {text}\n" for text in texts], add_special_tokens=False)["input_ids"]
        instruction_ids, *values = (np.asarray(v, dtype=np.int64) for v in variable)
        values.append(self._action_values[ACTIONS[action_id]])

        visual = self.visual_tokens(n_images)
        prefix_ids, prefix_mm = self._prefix(visual)
        question = [prefix_ids, instruction_ids, self._question_end]
        answer: list[np.ndarray] = []
        segment_lengths: list[int] = []
        for k in range(N_SEGMENTS):
            pieces = [self._labels[k], values[k]] + ([self._end] if k == N_SEGMENTS - 1 else [])
            answer.extend(pieces)
            segment_lengths.append(sum(len(p) for p in pieces))
        prompt_len = len(prefix_ids) + len(instruction_ids) + len(self._question_end)
        answer_len = sum(segment_lengths)

        input_ids = np.concatenate([*question, *answer, self._newline])
        length = len(input_ids)
        segment_ids = np.zeros(length, dtype=np.int64)
        segment_ids[prompt_len : prompt_len + answer_len] = np.repeat(
            np.arange(1, N_SEGMENTS + 1, dtype=np.int64), segment_lengths
        )
        labels = np.where(segment_ids > 0, input_ids, IGNORE_INDEX)
        mm_token_type_ids = np.zeros(length, dtype=np.int64)
        mm_token_type_ids[: len(prefix_mm)] = prefix_mm
        return EncodedPrompt(
            input_ids=torch.from_numpy(input_ids),
            labels=torch.from_numpy(labels),
            segment_ids=torch.from_numpy(segment_ids),
            mm_token_type_ids=torch.from_numpy(mm_token_type_ids),
            action_position=prompt_len - 1,
            action_id=action_id,
            visual_tokens=visual,
        )

    def build_sample(self, sample: Sample) -> EncodedPrompt:
        """Encode a dataset-index sample (its window length is the number of images)."""
        return self.build(
            sample.instruction,
            sample.subinstruction,
            sample.description_2d,
            sample.description_3d,
            sample.action,
            n_images=len(sample.window),
            key=sample.key,
        )

    def collate(self, prompts: Sequence[EncodedPrompt]) -> dict[str, torch.Tensor]:
        """Right-pad a micro-batch with this tokenizer's pad id (see :func:`collate_prompts`)."""
        return collate_prompts(prompts, self.pad_token_id)

    def render_text(
        self,
        instruction: str,
        subinstruction: str,
        description_2d: str,
        description_3d: str,
        action: str | int,
        n_images: int,
    ) -> str:
        """The whole prompt as text, image pads expanded (for inspection; ``build`` never uses it)."""
        images = [f"{VISION_START}{IMAGE_PAD * n}{VISION_END}" for n in self.visual_tokens(n_images)]
        *history, current = images
        values = [
            _clean(subinstruction, "subinstruction", None),
            _clean(description_2d, "2D description", None),
            _clean(description_3d, "3D description", None),
            ACTIONS[self._action_id(action, None)],
        ]
        intro = f"{ROLE_TEXT} {HISTORY_TEXT}\n{''.join(history)}" if history else f"{ROLE_TEXT}"
        answer = "\n".join(f"{label} {value}" for label, value in zip(ANSWER_LABELS, values, strict=True))
        return (
            f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n"
            f"{IM_START}user\n{intro}\n{CURRENT_TEXT}\n{current}\n"
            f"{TASK_TEXT} {_clean(instruction, 'instruction', None)}\n{ANSWER_TEXT} {ACTIONS_TEXT}{IM_END}\n"
            f"{IM_START}assistant\n{answer}{IM_END}\n"
        )

    def _action_id(self, action: str | int, key: str | None) -> int:
        if isinstance(action, str) and action in ACTIONS:
            return ACTIONS.index(action)
        if isinstance(action, int) and not isinstance(action, bool) and 0 <= action < len(ACTIONS):
            return action
        where = f"sample {key}: " if key is not None else ""
        raise PromptError(
            f"{where}unknown action {action!r}; expected one of {', '.join(ACTIONS)} or 0..{len(ACTIONS) - 1}"
        )

    def _check_boundaries(self) -> None:
        """Piecewise ids must equal the ids of the whole text, or the model trains on a tokenisation
        it never sees at inference."""
        layouts = (len(self._per_image),) if self._per_image is not None else (1, 2)
        for n_images in layouts:
            probe = (*_PROBE_TEXTS, "STOP", n_images)
            built = self.build(*probe).input_ids.numpy()
            whole = self._ids(self.render_text(*probe))
            if not np.array_equal(built, whole):
                raise PromptError(
                    f"{type(self.tokenizer).__name__} tokenises the prompt template differently in pieces "
                    "than as a whole (its pre-tokenizer does not split where Qwen2's does); "
                    "PromptBuilder supports Qwen2/Qwen2.5 tokenizers"
                )


def collate_prompts(prompts: Sequence[EncodedPrompt], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Stack prompts into a right-padded micro-batch.

    Returns int64 tensors ``input_ids`` (padded with ``pad_token_id``), ``attention_mask`` (1 on
    real tokens), ``labels`` (padded with -100), ``segment_ids`` and ``mm_token_type_ids`` (padded
    with 0), all [B, L_max], plus ``action_positions`` and ``action_ids`` [B].
    """
    if not prompts:
        raise PromptError("cannot collate an empty micro-batch")
    batch, length = len(prompts), max(len(p) for p in prompts)
    fills: Mapping[str, int] = {
        "input_ids": pad_token_id,
        "labels": IGNORE_INDEX,
        "segment_ids": 0,
        "mm_token_type_ids": 0,
    }
    out = {name: torch.full((batch, length), fill, dtype=torch.int64) for name, fill in fills.items()}
    out["attention_mask"] = torch.zeros((batch, length), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        for name in fills:
            out[name][row, :n] = getattr(prompt, name)
        out["attention_mask"][row, :n] = 1
    out["action_positions"] = torch.tensor([p.action_position for p in prompts], dtype=torch.int64)
    out["action_ids"] = torch.tensor([p.action_id for p in prompts], dtype=torch.int64)
    return out
