"""One training sample as text, token by token, to diff a janus sample against the reference's."""

from __future__ import annotations

from typing import Any

from janus_core.index import Sample
from janus_train.data.prompt import IGNORE_INDEX, SEGMENT_NAMES, PromptBuilder


def describe_sample(builder: PromptBuilder, sample: Sample) -> str:
    """The exact user and target texts of ``sample``, its token and supervised-token counts, and
    for every supervised token: its position, text, loss weight and segment. The action head's
    position is the one before the first supervised token."""
    texts = builder.sample_texts(sample)
    prompt = builder.build_sample(sample)
    supervised = (prompt.labels != IGNORE_INDEX).nonzero().flatten().tolist()
    lines = [
        f"sample {sample.key}",
        f"user text: {texts.user!r}",
        f"target text: {texts.target!r}",
        f"tokens: {len(prompt)} ({sum(prompt.visual_tokens)} image pads in {len(prompt.visual_tokens)} images)",
        f"supervised tokens: {len(supervised)}",
        f"action head: position {prompt.action_position}, action id {prompt.action_id}",
        f"{'position':>8}  {'token':<24} {'weight':>6}  segment",
    ]
    tokenizer: Any = builder.tokenizer
    for position in supervised:
        token = tokenizer.decode([int(prompt.input_ids[position])])
        segment = int(prompt.segment_ids[position])
        name = SEGMENT_NAMES[segment - 1] if segment > 0 else "-"
        weight = float(prompt.loss_weights[position])
        lines.append(f"{position:>8}  {token!r:<24} {weight:>6.3g}  {segment} {name}")
    return "\n".join(lines)
