"""The training loss: per-token weighted cross-entropy + action-head cross-entropy.

For one optimizer step over micro-batches m (gradient accumulation, all ranks)::

    loss = sum_m sum_t w_t * CE_t / W  +  d(step) * sum_m ACE_sum[m] / D_samples

with ``w_t`` the loss weight of the token position t predicts (the prompt's ``loss_weights``:
segment weight of its answer line, 1.0 on the closing ``<|im_end|>\\n``), ``W = sum_t w_t`` and
``D_samples`` the number of samples, both over the whole accumulated batch on all ranks, and
``d(step)`` the action-head weight (:meth:`LossConfig.distill_weight_at`). So the loss is the
weighted per-token mean of the whole step (plus the per-sample mean action CE), whatever the split
into micro-batches and ranks. The reference normalises each micro-batch by its own ``max(1, W)`` and
sums micro-batches over accumulation: per sample the two agree, per step the reference's is
``grad_accum`` times larger (janus deliberately normalises over the accumulated batch).

How a trainer uses it:

1. before the forward passes of a step, :meth:`LossDenominators.from_batches` on the step's
   micro-batches (CPU tensors, no model needed), then all-reduce :meth:`LossDenominators.as_tensor`
   (sum) across ranks;
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

from janus_train.data.prompt import IGNORE_INDEX
from janus_train.data.segments import N_SEGMENTS
from janus_train.model.model_config import DEFAULT_LOGIT_CHUNK_ROWS, LossConfig


class LossParts(NamedTuple):
    """Per-sample loss sums of one micro-batch, as the model's forward returns them.

    ``segment_ce_sum`` and ``action_ce`` carry gradients; the counts do not. A named tuple, so
    DeepSpeed's ZeRO-3 hooks can see the tensors in the model's output.
    """

    segment_ce_sum: torch.Tensor  # float32 [B, 4]: summed token CE per sample and segment (metrics)
    segment_tokens: torch.Tensor  # int64 [B, 4]: supervised tokens per sample and segment
    weighted_ce_sum: torch.Tensor  # float32 [B]: sum_t w_t * CE_t per sample (the loss)
    action_ce: torch.Tensor  # float32 [B]: action-head CE per sample
    action_correct: torch.Tensor  # bool [B]: action-head argmax == target
    logit_rows: int  # rows of token logits computed (= supervised tokens)

    def metric_sums(self) -> dict[str, torch.Tensor]:
        """Detached float64 sums to all-reduce across micro-batches and ranks before dividing."""
        return {
            "segment_ce_sum": self.segment_ce_sum.detach().sum(0).double(),
            "segment_tokens": self.segment_tokens.sum(0).double(),
            "weighted_ce_sum": self.weighted_ce_sum.detach().sum().double(),
            "action_ce_sum": self.action_ce.detach().sum().double(),
            "action_correct": self.action_correct.sum().double(),
            "samples": torch.tensor(float(self.action_ce.shape[0]), dtype=torch.float64, device=self.action_ce.device),
        }


@dataclass(frozen=True)
class LossDenominators:
    """Normalisers of one optimizer step: the summed token loss weights and the sample count."""

    weight_sum: float
    samples: float

    @classmethod
    def from_batches(cls, batches: Iterable[dict[str, torch.Tensor]]) -> LossDenominators:
        """Local denominators of a step's micro-batches (collated prompts); all-reduce before use."""
        batches = list(batches)
        if not batches:
            raise ValueError("no micro-batches to normalise over")
        for b in batches:
            count_segment_tokens(b["labels"], b["segment_ids"])  # checks labels and segments agree
        weight_sum = sum(float(b["loss_weights"].double().sum()) for b in batches)
        return cls(weight_sum=weight_sum, samples=float(sum(b["labels"].shape[0] for b in batches)))

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


class TokenLoss(NamedTuple):
    """Token cross-entropy sums of one micro-batch (see :func:`token_cross_entropy`)."""

    ce_sum: torch.Tensor  # float32 [B, 4]: summed CE per sample and segment
    tokens: torch.Tensor  # int64 [B, 4]: supervised tokens per sample and segment
    weighted_ce_sum: torch.Tensor  # float32 [B]: sum_t w_t * CE_t per sample
    rows: int  # rows of logits computed


def token_cross_entropy(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    segment_ids: torch.Tensor,
    loss_weights: torch.Tensor,
    lm_head: nn.Module,
    chunk_rows: int = DEFAULT_LOGIT_CHUNK_ROWS,
) -> TokenLoss:
    """Summed CE per sample and segment, and the per-token weighted sum, from hidden states [B, L, H].

    The hidden state at position t predicts token t+1, so only rows t with a supervised label at
    t+1 are gathered and passed to ``lm_head``; their logits are cast to float32, and each row's CE
    weighs ``loss_weights`` of the token it predicts. With more rows than ``chunk_rows``, chunks are
    recomputed in the backward pass (activation checkpointing), so only one chunk of logits is
    alive at a time.
    """
    batch, device = hidden.shape[0], hidden.device
    # Row selection on the labels' device (the CPU batch in training: no device sync), then moved.
    targets = labels[:, 1:]
    rows_b, rows_t = (targets != IGNORE_INDEX).nonzero(as_tuple=True)
    selected_targets = targets[rows_b, rows_t].to(device, non_blocking=True)
    segments = segment_ids[:, 1:].to(labels.device)[rows_b, rows_t]
    weights = loss_weights[:, 1:].to(labels.device)[rows_b, rows_t].to(device, torch.float32, non_blocking=True)
    bucket = (rows_b * N_SEGMENTS + segments - 1).to(device, non_blocking=True)
    sample = rows_b.to(device, non_blocking=True)
    selected = hidden[:, :-1][sample, rows_t.to(device, non_blocking=True)]  # [T, H]
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
    weighted = torch.zeros(batch, dtype=torch.float32, device=device).index_add(0, sample, ce * weights)
    return TokenLoss(ce_sum, tokens, weighted, rows)


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
    token_term = parts.weighted_ce_sum.sum() / denominators.weight_sum
    # The action term is added even at weight 0 (warm-up start), so the action head always gets a
    # gradient (zeros) rather than none, which sharded engines treat as a different graph.
    action_term = parts.action_ce.sum() / denominators.samples
    loss = token_term + config.distill_weight_at(step) * action_term
    return loss * scale if scale != 1.0 else loss
