"""The training sample of one window, token for token as the reference JanusVLN trainer builds it.

Conversation (Qwen2.5-VL chat format, no generation prompt)::

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{USER}<|im_end|>\\n
    <|im_start|>assistant\\n{TARGET}<|im_end|>\\n

``{USER}`` comes from a prompt template file (``configs/prompts/``): by default ``janusvln.yaml``,
the reference text word for word (typo included), where ``{history}`` is ``<image>`` once per
history image (no separator) and ``{current}`` the current image; ``janus.yaml`` is janus's own
wording, an option. Each ``<image>`` becomes ``<|vision_start|>`` + N x ``<|image_pad|>`` +
``<|vision_end|>``. ``{TARGET}`` is ``SUBINSTRUCTION: {sub}\\n2D_DESCRIPTION: {2d}\\n3D_DESCRIPTION:
{3d}\\nACTION: {action}``. Texts are stripped of surrounding whitespace, inner newlines are kept,
a list-valued text uses its first element.

Supervision (the reference's rules, whatever the template):

* labels: every token of the assistant turn after its header ``<|im_start|>assistant\\n`` (3 tokens
  with a Qwen tokenizer, as the reference masks): the target, the closing ``<|im_end|>`` and the
  ``\\n`` after it;
* loss weights: target line k (its trailing newline included for lines 1-3) weighs the segment
  weight w_k, its extent found by tokenising the growing prefixes ``line1\\n``, ``line1\\nline2\\n``,
  ...; every other supervised token (the closing ``<|im_end|>`` and ``\\n``) weighs 1.0;
* segment ids (per-segment metrics): segment k runs from the first token of its marker
  (``SUBINSTRUCTION:`` ...) to the token before the next marker, segment 4 to the end of the labels;
* the action head reads the hidden state just before the first supervised token.

Tokenisation: the question (system + user turn, one ``<|image_pad|>`` per image) up to its last
image is tokenised once per window length; per sample, the rest of the question (the instruction
and what follows), the target and its growing prefixes are tokenised in one batched call of the
fast tokenizer, then every image pad is repeated to its image's visual tokens. Special tokens split
the text, so these ids equal those of the whole conversation tokenised at once; the constructor
checks that on a probe sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from janus_core.index import ACTION_IDS, ACTIONS, Sample, parse_action
from janus_core.qwen_vision import IM_END, IM_START, IMAGE_PAD, VISION_END, VISION_START
from janus_train.data.prompt_template import IMAGE_TAG, PromptTemplate
from janus_train.data.segments import ANSWER_LABELS, N_SEGMENTS, SEGMENT_NAMES

if TYPE_CHECKING:
    from janus_cache.store import SampleMeta

IGNORE_INDEX = -100
"""Label of positions without loss (the value PyTorch's cross-entropy ignores)."""

ACTIONS_TEXT = "The possible actions are " + ", ".join(ACTIONS) + "."
"""The action sentence of janus's own wording (configs/prompts/janus.yaml); the tiny tokenizer's
corpus is built from it."""

CLOSING_WEIGHT = 1.0
"""Loss weight of the supervised tokens outside the target lines (closing ``<|im_end|>``, ``\\n``)."""
_MAX_CACHED_HEADS = 64
# The reference looks for each marker preceded by one of these (the first match wins).
_MARKER_PREFIXES = ("", "\n", " ", "\n\n")



class PromptError(ValueError):
    """A sample cannot be turned into a prompt; the message names the sample and the field."""


@dataclass(frozen=True, slots=True)
class PromptFields:
    """What a sample's prompt is made of: its instruction (the user turn), and the subinstruction,
    2D and 3D descriptions and action of its target. Texts as the dataset holds them: a str, or a
    list whose first element is read (see :func:`clean_text`)."""

    instruction: Any
    subinstruction: Any
    description_2d: Any
    description_3d: Any
    action: str | int
    """An action name or id (:data:`janus_core.index.ACTIONS`)."""

    @classmethod
    def of(cls, sample: Sample | SampleMeta) -> PromptFields:
        """The fields of a dataset-index sample or of a cached sample's meta (named alike)."""
        return cls(sample.instruction, sample.subinstruction, sample.description_2d, sample.description_3d,
                   sample.action)


# The probe sample the constructor checks the piecewise tokenisation on: punctuation, digits and
# an inner newline at the ends of the variable texts, where a boundary could merge.
_PROBE = PromptFields(
    instruction="Walk past the 2 chairs, then stop.",
    subinstruction="Turn left at the door.",
    description_2d='"Red" wall ahead;\n3 doors to the left...',
    description_3d="1.5 m to the wall (left side).",
    action="STOP",
)


@dataclass(frozen=True, slots=True)
class SampleText:
    """The texts of one sample: the user turn (images as ``<image>``) and the assistant's target."""

    user: str
    lines: tuple[str, ...]
    """The four target lines (``SUBINSTRUCTION: ...`` ... ``ACTION: ...``)."""
    action_id: int

    @property
    def target(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    """Token-level tensors of one sample (length L): int64 ids, labels, segment ids, image-token
    types, float32 ``loss_weights`` (0 where unsupervised).

    ``action_position`` is the index of the hidden state just before the first supervised token
    (the ``\\n`` of ``<|im_start|>assistant\\n``): the action head reads it.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    segment_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    loss_weights: torch.Tensor
    action_position: int
    action_id: int
    visual_tokens: tuple[int, ...]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def clean_text(text: Any, field: str, key: str | None) -> str:
    """A text as the reference reads it: the first element of a list, surrounding whitespace
    stripped, inner newlines kept. Empty texts are refused."""
    where = f"sample {key}: " if key is not None else ""
    if isinstance(text, (list, tuple)):
        if not text:
            raise PromptError(f"{where}{field} is an empty list")
        text = text[0]
    if not isinstance(text, str):
        raise PromptError(f"{where}{field} must be a string, got {type(text).__name__}")
    cleaned = text.strip()
    if not cleaned:
        raise PromptError(f"{where}{field} is empty")
    return cleaned


def action_index(action: str | int, key: str | None = None) -> int:
    """Action id of the action head: STOP 0, MOVE_FORWARD 1, TURN_LEFT 2, TURN_RIGHT 3."""
    name = parse_action(action.strip() if isinstance(action, str) else action)
    if name is not None:
        return ACTION_IDS[name]
    where = f"sample {key}: " if key is not None else ""
    raise PromptError(
        f"{where}unknown action {action!r}; expected one of {', '.join(ACTIONS)} or 0..{len(ACTIONS) - 1}"
    )


class PromptBuilder:
    """Builds :class:`EncodedPrompt` s with a Qwen2.5(-VL) fast tokenizer.

    ``visual_tokens_per_image`` is the number of ``<|image_pad|>`` tokens per image: one int for
    every image (e.g. 529 at pad644), or one int per image of the window (its length is then the
    number of images every sample must have). ``segment_weights`` are the loss weights of the four
    target lines; ``template`` the user turn's wording (default: the reference's).
    """

    def __init__(
        self,
        tokenizer: Any,
        visual_tokens_per_image: int | Sequence[int],
        segment_weights: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
        template: PromptTemplate | None = None,
    ) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise PromptError(f"PromptBuilder needs a fast tokenizer, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.template = template if template is not None else PromptTemplate.load()
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
        weights = tuple(float(w) for w in segment_weights)
        if len(weights) != N_SEGMENTS or any(not w > 0 for w in weights):
            # The reference turns a weight of 0 into 1.0 (its fallback); janus refuses it instead.
            raise PromptError(f"segment_weights needs {N_SEGMENTS} numbers > 0 ({', '.join(SEGMENT_NAMES)}), "
                              f"got {list(segment_weights)}")
        self.segment_weights = weights

        specials = (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD)
        self.token_ids = {name: self._special_id(name) for name in specials}
        self.image_token_id = self.token_ids[IMAGE_PAD]
        pad = tokenizer.pad_token_id
        if pad is None:
            raise PromptError("the tokenizer has no pad token; set tokenizer.pad_token (Qwen uses <|endoftext|>)")
        self.pad_token_id = int(pad)

        self._image_block = f"{VISION_START}{IMAGE_PAD}{VISION_END}"
        # 3 tokens with Qwen's tokenizer (<|im_start|>, assistant, \n): the head the reference masks.
        self._header = self._ids(f"{IM_START}assistant\n")
        self._closing = self._ids(f"{IM_END}\n")
        self._heads: dict[str, np.ndarray] = {}
        # Marker variants as the reference searches them: (ids of prefix+marker, marker length).
        self._markers = [
            [(self._ids(prefix + marker).tolist(), len(self._ids(marker))) for prefix in _MARKER_PREFIXES]
            for marker in ANSWER_LABELS
        ]
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

    # ------------------------------------------------------------------------------- building

    def texts(self, fields: PromptFields, n_images: int, key: str | None = None) -> SampleText:
        """The exact user text (images as ``<image>``) and target text of a sample."""
        action_id = action_index(fields.action, key)
        if n_images < 1:
            raise PromptError(f"a sample needs at least one image (the current view), got {n_images}")
        lines = self._lines(fields, action_id, key)
        user = self.template.user_text(clean_text(fields.instruction, "instruction", key), n_images - 1)
        return SampleText(user=user, lines=tuple(lines), action_id=action_id)

    def _lines(self, fields: PromptFields, action_id: int, key: str | None) -> list[str]:
        values = (
            clean_text(fields.subinstruction, "subinstruction", key),
            clean_text(fields.description_2d, "2D description", key),
            clean_text(fields.description_3d, "3D description", key),
            ACTIONS[action_id],
        )
        return [f"{label} {value}" for label, value in zip(ANSWER_LABELS, values, strict=True)]

    def _question_text(self, user: str) -> str:
        """System and user turns, one image pad per image."""
        user = user.replace(IMAGE_TAG, self._image_block)
        return f"{IM_START}system\n{self.template.system}{IM_END}\n{IM_START}user\n{user}{IM_END}\n"

    def build(self, fields: PromptFields, n_images: int, key: str | None = None) -> EncodedPrompt:
        """Encode one sample of ``n_images`` images; ``key`` (the sample key) only serves error messages."""
        visual = self.visual_tokens(n_images)
        text = self.texts(fields, n_images, key)
        # Growing prefixes "line1\n", "line1\nline2\n", "line1\nline2\nline3\n": segment ends.
        prefixes = ["\n".join(text.lines[: k + 1]) + "\n" for k in range(N_SEGMENTS - 1)]
        # The question up to its last image is the same for every sample of a window length: its
        # ids are cached. Special tokens split the text, so the parts tokenise as the whole does.
        question = self._question_text(text.user)
        cut = question.rfind(VISION_END) + len(VISION_END) if VISION_END in question else 0
        tail_ids, target_ids, *prefix_ids = (
            np.asarray(ids, dtype=np.int64)
            for ids in self.tokenizer([question[cut:], text.target, *prefixes], add_special_tokens=False)["input_ids"]
        )
        question_ids = self._expand_images(np.concatenate([self._head_ids(question[:cut]), tail_ids]), visual, key)
        ends = [len(ids) for ids in prefix_ids] + [len(target_ids)]

        answer = np.concatenate([target_ids, self._closing])
        start = len(question_ids) + len(self._header)
        input_ids = np.concatenate([question_ids, self._header, answer])
        length = len(input_ids)
        labels = np.full(length, IGNORE_INDEX, dtype=np.int64)
        labels[start:] = answer
        weights = np.zeros(length, dtype=np.float32)
        previous = 0
        for k, end in enumerate(ends):
            weights[start + previous : start + end] = self.segment_weights[k]
            previous = end
        weights[(labels != IGNORE_INDEX) & (weights == 0)] = CLOSING_WEIGHT
        segment_ids = np.zeros(length, dtype=np.int64)
        segment_ids[start:] = self._segments(answer, key)
        mm_token_type_ids = (input_ids == self.image_token_id).astype(np.int64)
        return EncodedPrompt(
            input_ids=torch.from_numpy(input_ids),
            labels=torch.from_numpy(labels),
            segment_ids=torch.from_numpy(segment_ids),
            mm_token_type_ids=torch.from_numpy(mm_token_type_ids),
            loss_weights=torch.from_numpy(weights),
            action_position=start - 1,
            action_id=text.action_id,
            visual_tokens=visual,
        )

    def _head_ids(self, head: str) -> np.ndarray:
        ids = self._heads.get(head)
        if ids is None:
            if len(self._heads) >= _MAX_CACHED_HEADS:  # a template with the instruction before the images
                self._heads.clear()
            ids = self._heads[head] = self._ids(head)
        return ids

    def _expand_images(self, ids: np.ndarray, visual: tuple[int, ...], key: str | None) -> np.ndarray:
        pads = np.flatnonzero(ids == self.image_token_id)
        if len(pads) != len(visual):
            where = f"sample {key}: " if key is not None else ""
            raise PromptError(
                f"{where}the user turn holds {len(pads)} images but the window has {len(visual)} "
                f"(does a text contain '{IMAGE_TAG}' or an image token, or does the template lack {{history}}?)"
            )
        repeats = np.ones(len(ids), dtype=np.int64)
        repeats[pads] = visual
        return np.repeat(ids, repeats)

    def _segments(self, answer: np.ndarray, key: str | None) -> np.ndarray:
        """Segment ids of the supervised tokens, by the reference's marker search."""
        tokens = answer.tolist()
        starts: list[int] = []
        search = 0
        for variants in self._markers:
            best: tuple[int, int] | None = None
            for variant, marker_len in variants:
                at = _find(tokens, variant, search)
                if at >= 0:
                    marker_at = at + len(variant) - marker_len
                    if best is None or marker_at < best[0]:
                        best = (marker_at, marker_len)
            if best is None:
                break
            starts.append(best[0])
            search = best[0] + best[1]
        if len(starts) != N_SEGMENTS or starts[0] != 0:
            where = f"sample {key}: " if key is not None else ""
            raise PromptError(f"{where}the target does not tokenise into its four marked lines "
                              f"({', '.join(ANSWER_LABELS)})")
        segments = np.zeros(len(tokens), dtype=np.int64)
        for k, begin in enumerate(starts):
            segments[begin:] = k + 1
        return segments

    def build_sample(self, sample: Sample) -> EncodedPrompt:
        """Encode a dataset-index sample (its window length is the number of images)."""
        return self.build(PromptFields.of(sample), n_images=len(sample.window), key=sample.key)

    def sample_texts(self, sample: Sample) -> SampleText:
        """The user and target texts of a dataset-index sample."""
        return self.texts(PromptFields.of(sample), len(sample.window), sample.key)

    def collate(self, prompts: Sequence[EncodedPrompt]) -> dict[str, torch.Tensor]:
        """Right-pad a micro-batch with this tokenizer's pad id (see :func:`collate_prompts`)."""
        return collate_prompts(prompts, self.pad_token_id)

    def render_text(self, fields: PromptFields, n_images: int) -> str:
        """The whole conversation as text, image pads expanded (for inspection; ``build`` never uses it)."""
        text = self.texts(fields, n_images)
        pieces = self._question_text(text.user).split(IMAGE_PAD)
        counts = self.visual_tokens(n_images)
        question = pieces[0] + "".join(IMAGE_PAD * n + piece for n, piece in zip(counts, pieces[1:], strict=True))
        return f"{question}{IM_START}assistant\n{text.target}{IM_END}\n"

    def _check_boundaries(self) -> None:
        """Piecewise ids must equal the ids of the whole text, or the model trains on a tokenisation
        it never sees at inference."""
        layouts = (len(self._per_image),) if self._per_image is not None else (1, 2)
        for n_images in layouts:
            try:
                built = self.build(_PROBE, n_images).input_ids.numpy()
            except PromptError:
                built = None  # e.g. its markers do not come out as whole tokens
            whole = self._ids(self.render_text(_PROBE, n_images))
            if built is None or not np.array_equal(built, whole):
                raise PromptError(
                    f"{type(self.tokenizer).__name__} tokenises the conversation differently in pieces "
                    "than as a whole (its pre-tokenizer does not split where Qwen2's does); "
                    "PromptBuilder supports Qwen2/Qwen2.5 tokenizers"
                )


def _find(sequence: list[int], pattern: list[int], start: int) -> int:
    """First index >= start where ``pattern`` occurs in ``sequence``, or -1."""
    n = len(pattern)
    if n == 0:
        return -1
    first = pattern[0]
    for i in range(start, len(sequence) - n + 1):
        if sequence[i] == first and sequence[i : i + n] == pattern:
            return i
    return -1


def collate_prompts(prompts: Sequence[EncodedPrompt], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Stack prompts into a right-padded micro-batch.

    Returns int64 tensors ``input_ids`` (padded with ``pad_token_id``), ``attention_mask`` (1 on
    real tokens), ``labels`` (padded with -100), ``segment_ids`` and ``mm_token_type_ids`` (padded
    with 0), float32 ``loss_weights`` (padded with 0), all [B, L_max], plus ``action_positions``
    and ``action_ids`` [B].
    """
    if not prompts:
        raise PromptError("cannot collate an empty micro-batch")
    batch, length = len(prompts), max(len(p) for p in prompts)
    fills: Mapping[str, tuple[float, torch.dtype]] = {
        "input_ids": (pad_token_id, torch.int64),
        "labels": (IGNORE_INDEX, torch.int64),
        "segment_ids": (0, torch.int64),
        "mm_token_type_ids": (0, torch.int64),
        "loss_weights": (0.0, torch.float32),
    }
    out = {name: torch.full((batch, length), fill, dtype=dtype) for name, (fill, dtype) in fills.items()}
    out["attention_mask"] = torch.zeros((batch, length), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        for name in fills:
            out[name][row, :n] = getattr(prompt, name)
        out["attention_mask"][row, :n] = 1
    out["action_positions"] = torch.tensor([p.action_position for p in prompts], dtype=torch.int64)
    out["action_ids"] = torch.tensor([p.action_id for p in prompts], dtype=torch.int64)
    return out
