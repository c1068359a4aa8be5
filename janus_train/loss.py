"""The training loss: weighted segment cross-entropy + action-head cross-entropy.

For one optimizer step over micro-batches m (gradient accumulation, all ranks)::

    loss = sum_m sum_k w_k * CE_sum[m, k] / D_tokens  +  distill(step) * sum_m ACE_sum[m] / D_samples

with ``CE_sum[m, k]`` the summed token cross-entropy of answer segment k (1..4) in micro-batch m,
``D_tokens = sum_k w_k * tokens_k`` and ``D_samples`` the number of samples, both over the whole
accumulated batch on all ranks. So the loss is the per-token weighted mean of the whole step
(plus the per-sample mean action CE), whatever the split into micro-batches and ranks.

How a trainer uses it:

1. before the forward passes of a step, :func:`count_segment_tokens` on every micro-batch (CPU
   tensors, no model needed), :meth:`LossDenominators.from_counts`, then all-reduce
   :meth:`LossDenominators.as_tensor` (sum) across ranks;
2. per micro-batch: the model's forward returns :class:`LossParts` (sums, not means);
   :func:`micro_batch_loss` gives this micro-batch's share of the step's loss; ``backward`` it.
   The shares of all micro-batches on all ranks add up to the step's loss; a trainer whose engine
   averages gradients over ranks (DeepSpeed: divide by world size) or divides the loss by the
   accumulation steps (DeepSpeed's default ``scale_wrt_gas``) passes ``scale`` to undo that.

Token logits are computed only for supervised positions (the answer, ~100-300 tokens of a
~5k-token prompt), in row chunks, in float32.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from janus_train.prompt import IGNORE_INDEX, N_SEGMENTS, SEGMENT_NAMES

DEFAULT_LOGIT_CHUNK_ROWS = 1024
"""Rows of token logits alive at once (1024 x 152k float32 = 620 MB at Qwen's vocabulary)."""


@dataclass(frozen=True)
class LossConfig:
    """Loss weights. ``segment_weights`` follow :data:`janus_train.prompt.SEGMENT_NAMES`.

    The action-head term weighs ``distill_weight``; with ``distill_ramp_steps > 0`` it rises
    linearly from 0 at optimizer step 0 to ``distill_weight`` at step ``distill_ramp_steps``.
    """

    segment_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    distill_weight: float = 1.0
    distill_ramp_steps: int = 0

    def __post_init__(self) -> None:
        if len(self.segment_weights) != N_SEGMENTS:
            raise ValueError(
                f"segment_weights needs {N_SEGMENTS} values ({', '.join(SEGMENT_NAMES)}), got {self.segment_weights}"
            )
        if any(w < 0 for w in self.segment_weights) or not any(w > 0 for w in self.segment_weights):
            raise ValueError(f"segment_weights must be >= 0 with at least one > 0, got {self.segment_weights}")
        if self.distill_weight < 0:
            raise ValueError(f"distill_weight must be >= 0, got {self.distill_weight}")
        if self.distill_ramp_steps < 0:
            raise ValueError(f"distill_ramp_steps must be >= 0, got {self.distill_ramp_steps}")

    def distill_weight_at(self, step: int) -> float:
        """Weight of the action-head term at optimizer step ``step`` (0-based)."""
        if self.distill_ramp_steps == 0:
            return self.distill_weight
        return self.distill_weight * min(1.0, max(step, 0) / self.distill_ramp_steps)


class LossParts(NamedTuple):
    """Per-sample loss sums of one micro-batch, as the model's forward returns them.

    ``segment_ce_sum`` and ``action_ce`` carry gradients; the counts do not. A named tuple, so
    DeepSpeed's ZeRO-3 hooks can see the tensors in the model's output.
    """

    segment_ce_sum: torch.Tensor  # float32 [B, 4]: summed token CE per sample and segment
    segment_tokens: torch.Tensor  # int64 [B, 4]: supervised tokens per sample and segment
    action_ce: torch.Tensor  # float32 [B]: action-head CE per sample
    action_correct: torch.Tensor  # bool [B]: action-head argmax == target
    logit_rows: int  # rows of token logits computed (= supervised tokens)

    def metric_sums(self) -> dict[str, torch.Tensor]:
        """Detached float64 sums to all-reduce across micro-batches and ranks before dividing."""
        return {
            "segment_ce_sum": self.segment_ce_sum.detach().sum(0).double(),
            "segment_tokens": self.segment_tokens.sum(0).double(),
            "action_ce_sum": self.action_ce.detach().sum().double(),
            "action_correct": self.action_correct.sum().double(),
            "samples": torch.tensor(float(self.action_ce.shape[0]), dtype=torch.float64, device=self.action_ce.device),
        }


@dataclass(frozen=True)
class LossDenominators:
    """Normalisers of one optimizer step: ``sum_k w_k * tokens_k`` and the sample count."""

    weight_sum: float
    samples: float

    @classmethod
    def from_counts(cls, segment_tokens: torch.Tensor, config: LossConfig) -> LossDenominators:
        """From supervised-token counts [..., 4] of the step's micro-batches (one row per sample)."""
        counts = segment_tokens.reshape(-1, N_SEGMENTS).to(torch.float64)
        weights = torch.tensor(config.segment_weights, dtype=torch.float64)
        return cls(weight_sum=float((counts.sum(0) * weights).sum()), samples=float(counts.shape[0]))

    @classmethod
    def from_batches(cls, batches: Iterable[dict[str, torch.Tensor]], config: LossConfig) -> LossDenominators:
        """Local denominators of a step's micro-batches (collated prompts); all-reduce before use."""
        counts = [count_segment_tokens(b["labels"], b["segment_ids"]) for b in batches]
        if not counts:
            raise ValueError("no micro-batches to normalise over")
        return cls.from_counts(torch.cat(counts), config)

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """float64 [2] for a sum all-reduce across ranks."""
        return torch.tensor([self.weight_sum, self.samples], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> LossDenominators:
        weight_sum, samples = values.double().tolist()
        return cls(weight_sum=weight_sum, samples=samples)

    def __add__(self, other: LossDenominators) -> LossDenominators:
        return LossDenominators(self.weight_sum + other.weight_sum, self.samples + other.samples)


def count_segment_tokens(labels: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Supervised tokens per sample and segment, int64 [B, 4], from a collated micro-batch.

    Also checks the two agree: every supervised token is in a segment 1..4 and no unsupervised
    token is (so the loss's per-segment scatter needs no checks on the device).
    """
    if labels.shape != segment_ids.shape or labels.dim() != 2:
        raise ValueError(f"labels {tuple(labels.shape)} and segment_ids {tuple(segment_ids.shape)} must both be [B, L]")
    supervised = labels != IGNORE_INDEX
    in_segment = (segment_ids >= 1) & (segment_ids <= N_SEGMENTS)
    if not torch.equal(supervised, in_segment):
        rows = (supervised != in_segment).any(1).nonzero().flatten().tolist()
        raise ValueError(
            f"labels and segment_ids disagree in batch rows {rows}: every supervised token needs a segment id "
            f"in 1..{N_SEGMENTS}, every other token segment id 0"
        )
    one_hot = F.one_hot(segment_ids.clamp(0, N_SEGMENTS), N_SEGMENTS + 1)[..., 1:]
    return one_hot.sum(1).to(torch.int64)


def token_cross_entropy(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    segment_ids: torch.Tensor,
    lm_head: nn.Module,
    chunk_rows: int = DEFAULT_LOGIT_CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed CE per sample and segment from last hidden states [B, L, H].

    The hidden state at position t predicts token t+1, so only rows t with a supervised label at
    t+1 are gathered and passed to ``lm_head``; their logits are cast to float32. With more rows
    than ``chunk_rows``, chunks are recomputed in the backward pass (activation checkpointing), so
    only one chunk of logits is alive at a time. Returns ``(ce_sum [B, 4] float32,
    tokens [B, 4] int64, rows)``.
    """
    batch, device = hidden.shape[0], hidden.device
    # Row selection on the labels' device (the CPU batch in training: no device sync), then moved.
    targets = labels[:, 1:]
    rows_b, rows_t = (targets != IGNORE_INDEX).nonzero(as_tuple=True)
    selected_targets = targets[rows_b, rows_t].to(device, non_blocking=True)
    segments = segment_ids[:, 1:].to(labels.device)[rows_b, rows_t]
    bucket = (rows_b * N_SEGMENTS + segments - 1).to(device, non_blocking=True)
    selected = hidden[:, :-1][rows_b.to(device, non_blocking=True), rows_t.to(device, non_blocking=True)]  # [T, H]
    rows = int(selected.shape[0])
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")

    def chunk_ce(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(lm_head(h).float(), t, reduction="none")

    pieces = []
    recompute = rows > chunk_rows and torch.is_grad_enabled()
    for start in range(0, rows, chunk_rows):
        h, t = selected[start : start + chunk_rows], selected_targets[start : start + chunk_rows]
        pieces.append(checkpoint(chunk_ce, h, t, use_reentrant=False) if recompute else chunk_ce(h, t))
    ce = torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)

    flat = torch.zeros(batch * N_SEGMENTS, dtype=torch.float32, device=device)
    ce_sum = flat.index_add(0, bucket, ce).view(batch, N_SEGMENTS)
    tokens = torch.zeros(batch * N_SEGMENTS, dtype=torch.int64, device=device)
    tokens = tokens.index_add(0, bucket, torch.ones_like(bucket)).view(batch, N_SEGMENTS)
    return ce_sum, tokens, rows


def action_cross_entropy(action_logits: torch.Tensor, action_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample CE [B] (float32) of the action head's logits [B, n_actions] and whether its argmax is right."""
    logits = action_logits.float()
    targets = action_ids.to(logits.device)
    return F.cross_entropy(logits, targets, reduction="none"), logits.argmax(-1) == targets


def micro_batch_loss(
    parts: LossParts,
    denominators: LossDenominators,
    config: LossConfig,
    step: int,
    scale: float = 1.0,
) -> torch.Tensor:
    """This micro-batch's share of the optimizer step's loss (see the module docstring).

    ``denominators`` cover the whole step on all ranks; ``step`` is the optimizer step (for the
    action-term ramp); ``scale`` multiplies the result (e.g. world size x accumulation steps to
    undo an engine's averaging).
    """
    if denominators.weight_sum <= 0 or denominators.samples <= 0:
        raise ValueError(f"loss denominators must be positive, got {denominators}")
    weights = torch.tensor(config.segment_weights, dtype=torch.float32, device=parts.segment_ce_sum.device)
    token_term = (parts.segment_ce_sum * weights).sum() / denominators.weight_sum
    # The action term is added even at weight 0 (warm-up start), so the action head always gets a
    # gradient (zeros) rather than none, which sharded engines treat as a different graph.
    action_term = parts.action_ce.sum() / denominators.samples
    loss = token_term + config.distill_weight_at(step) * action_term
    return loss * scale if scale != 1.0 else loss
