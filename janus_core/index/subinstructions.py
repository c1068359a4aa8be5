"""Which subinstruction of an episode a frame gets (episode-folder format).

An episode lists subinstructions and the sorted ``checkpoint_frame_index`` values c_0 < c_1 < ...
at which each is completed. Two rules, chosen by the cache setting ``subinstruction_rule``:

* ``reference`` (default; the reference JanusVLN trainer, docs/train.md "The training sample"):
  subinstruction i covers frames [start_i, end_i] with start_0 = 0, start_i = c_{i-1} + 1 when
  checkpoint i-1 exists (else 0), end_i = c_i when checkpoint i exists (else the last frame);
  later subinstructions overwrite earlier ones and frames still uncovered get the last one. So
  with fewer than (subinstructions - 1) checkpoints the last subinstruction covers every frame.
* ``janus`` (opt-in): subinstruction i is the one after i completed checkpoints, i.e. it covers
  c_{i-1} + 1 .. c_i; frames after the last checkpoint, and any beyond the listed
  subinstructions, get the last one. With few checkpoints the early frames keep the early texts.

Both agree whenever there are at least (subinstructions - 1) checkpoints.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class SubinstructionRule(enum.StrEnum):
    REFERENCE = "reference"
    JANUS = "janus"


SUBINSTRUCTION_RULES: tuple[str, ...] = tuple(rule.value for rule in SubinstructionRule)
DEFAULT_SUBINSTRUCTION_RULE = SubinstructionRule.REFERENCE.value


def parse_rule(rule: str) -> SubinstructionRule:
    try:
        return SubinstructionRule(rule)
    except ValueError:
        choices = ", ".join(SUBINSTRUCTION_RULES)
        raise ValueError(f"subinstruction_rule must be one of {choices}, got {rule!r}") from None


def subinstruction_for(
    frame: int,
    subinstructions: Sequence[str],
    checkpoints: Sequence[int],
    rule: str = DEFAULT_SUBINSTRUCTION_RULE,
) -> str:
    """The subinstruction of ``frame`` under ``rule``; ``checkpoints`` must be sorted."""
    if not subinstructions:
        raise ValueError("an episode needs at least one subinstruction")
    if parse_rule(rule) is SubinstructionRule.JANUS:
        # Number of checkpoints strictly before this frame = the subinstruction it belongs to.
        i = sum(1 for cp in checkpoints if cp < frame)
        return subinstructions[min(i, len(subinstructions) - 1)]
    covering = subinstructions[-1]  # what a frame no range covers gets
    for i, text in enumerate(subinstructions):
        start = checkpoints[i - 1] + 1 if 0 < i <= len(checkpoints) else 0
        end = checkpoints[i] if i < len(checkpoints) else None  # None: up to the last frame
        if start <= frame and (end is None or frame <= end):
            covering = text  # later subinstructions overwrite earlier ones
    return covering
