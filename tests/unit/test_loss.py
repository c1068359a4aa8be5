"""The loss: per-token weighted CE normalised over the whole accumulated batch, the action-head CE
with its ramp from a start to an end weight, and token logits only where a label is supervised.

These tests use a plain ``nn.Linear`` as lm_head and random hidden states over real prompts, so
they check the loss arithmetic against an independent full-logits computation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.model_cases import VISUAL_TOKENS, tiny_tokenizer
from janus_core.index import DatasetIndex
from janus_train.data.prompt import IGNORE_INDEX, PromptBuilder
from janus_train.model.loss import (
    LossConfig,
    LossDenominators,
    LossParts,
    action_cross_entropy,
    count_segment_tokens,
    micro_batch_loss,
    token_cross_entropy,
)

HIDDEN, VOCAB = 16, 1408


def batches_with(index: DatasetIndex, segment_weights: tuple[float, ...]) -> list[dict[str, torch.Tensor]]:
    """Three collated micro-batches of real prompts (sizes 2, 1, 2, different lengths)."""
    b = PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS, segment_weights=segment_weights)
    samples = index.samples
    groups = [(samples[0], samples[14]), (samples[20],), (samples[9], samples[33])]
    return [b.collate([b.build_sample(s) for s in group]) for group in groups]


@pytest.fixture(scope="module")
def prompt_batches(sample_index: DatasetIndex) -> list[dict[str, torch.Tensor]]:
    return batches_with(sample_index, (1.0, 1.0, 1.0, 1.0))


@pytest.fixture(scope="module")
def weighted_batches(sample_index: DatasetIndex) -> list[dict[str, torch.Tensor]]:
    """The same micro-batches with segment weights 1, 0.5, 0.5, 3."""
    return batches_with(sample_index, (1.0, 0.5, 0.5, 3.0))


def independent_weights(batch: dict[str, torch.Tensor], segment_weights: tuple[float, ...]) -> torch.Tensor:
    """Per-position weights [B, L] from the rule, not from the prompt: segment k weighs w_k, the
    last two supervised tokens of each row (the closing <|im_end|> and newline) weigh 1."""
    weights = torch.tensor([0.0, *segment_weights])[batch["segment_ids"]]
    for row in range(weights.shape[0]):
        last = int((batch["labels"][row] != IGNORE_INDEX).nonzero()[-1])
        weights[row, last - 1 : last + 1] = 1.0
    return weights


def random_hidden(batch: dict[str, torch.Tensor], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch["input_ids"].shape, HIDDEN, generator=g, requires_grad=True)


def lm_head(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(HIDDEN, VOCAB, bias=False)


def reference_token_losses(hidden: torch.Tensor, batch: dict[str, torch.Tensor], head: nn.Linear) -> torch.Tensor:
    """Per-position CE [B, L-1] from the logits of every position (0 where unsupervised)."""
    logits = head(hidden[:, :-1]).float()
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")


def parts_for(
    hidden: torch.Tensor,
    batch: dict[str, torch.Tensor],
    head: nn.Module,
    action_logits: torch.Tensor,
    chunk_rows: int = 1024,
) -> LossParts:
    token = token_cross_entropy(hidden, batch["labels"], batch["segment_ids"], batch["loss_weights"], head, chunk_rows)
    action_ce, correct = action_cross_entropy(action_logits, batch["action_ids"])
    return LossParts(token.ce_sum, token.tokens, token.weighted_ce_sum, action_ce, correct, token.rows)


def test_segment_sums_equal_a_full_logits_computation(prompt_batches: list[dict[str, torch.Tensor]]) -> None:
    batch, head = prompt_batches[0], lm_head()
    hidden = random_hidden(batch, 0)
    ce_sum, tokens, weighted, rows = token_cross_entropy(
        hidden, batch["labels"], batch["segment_ids"], batch["loss_weights"], head
    )
    reference = reference_token_losses(hidden, batch, head)
    torch.testing.assert_close(weighted, (reference * batch["loss_weights"][:, 1:]).sum(1))
    segments = batch["segment_ids"][:, 1:]
    for k in range(4):
        in_segment = segments == k + 1
        torch.testing.assert_close(ce_sum[:, k], (reference * in_segment).sum(1))
        assert tokens[:, k].tolist() == in_segment.sum(1).tolist()
    assert rows == int((batch["labels"] != IGNORE_INDEX).sum())
    assert torch.equal(tokens, count_segment_tokens(batch["labels"], batch["segment_ids"]))


def test_logits_are_computed_only_for_supervised_rows_in_chunks(prompt_batches: list[dict[str, torch.Tensor]]) -> None:
    batch, head = prompt_batches[2], lm_head()
    rows_seen: list[int] = []
    head.register_forward_hook(lambda _m, args, _out: rows_seen.append(args[0].shape[0]))
    supervised = int((batch["labels"] != IGNORE_INDEX).sum())
    positions = batch["input_ids"].numel()
    assert supervised < positions // 2

    hidden = random_hidden(batch, 1)
    args = (hidden, batch["labels"], batch["segment_ids"], batch["loss_weights"], head)
    whole = token_cross_entropy(*args, chunk_rows=4096).ce_sum
    assert rows_seen == [supervised]
    (grad_whole,) = torch.autograd.grad(whole.sum(), hidden)

    rows_seen.clear()
    chunked, _, _, rows = token_cross_entropy(*args, chunk_rows=16)
    assert rows == supervised
    assert sum(rows_seen) == supervised and max(rows_seen) == 16
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), hidden)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(grad_chunked, grad_whole)
    # Only positions that predict a supervised token get a gradient.
    predicts = torch.zeros(batch["input_ids"].shape, dtype=torch.bool)
    predicts[:, :-1] = batch["labels"][:, 1:] != IGNORE_INDEX
    assert (grad_whole[~predicts] == 0).all() and (grad_whole[predicts].abs().sum(-1) > 0).all()


def test_loss_is_the_weighted_token_mean_plus_the_weighted_action_mean(
    weighted_batches: list[dict[str, torch.Tensor]],
) -> None:
    """Each token's CE weighs the weight of the token it predicts: its line's segment weight, 1.0
    for the closing <|im_end|> and newline."""
    batch, head = weighted_batches[0], lm_head()
    config = LossConfig(distill_loss_weight=0.3)
    hidden = random_hidden(batch, 2)
    action_logits = torch.randn(2, 4)
    parts = parts_for(hidden, batch, head, action_logits)
    loss = micro_batch_loss(parts, LossDenominators.from_batches([batch]), config, step=0)

    per_token = reference_token_losses(hidden, batch, head)
    weights = independent_weights(batch, (1.0, 0.5, 0.5, 3.0))
    assert torch.equal(weights, batch["loss_weights"])
    expected = (weights[:, 1:] * per_token).sum() / weights.sum()
    expected = expected + 0.3 * F.cross_entropy(action_logits, batch["action_ids"])
    torch.testing.assert_close(loss, expected)


def test_accumulated_micro_batches_with_global_denominators_equal_one_big_batch(
    weighted_batches: list[dict[str, torch.Tensor]],
) -> None:
    """Gradient accumulation over micro-batches of different sizes and lengths gives the loss and
    gradients of the concatenated batch: normalised once over the step, not per micro-step."""
    config = LossConfig(distill_loss_weight=0.5)
    prompt_batches = weighted_batches
    head = lm_head()
    hiddens = [random_hidden(b, 10 + i) for i, b in enumerate(prompt_batches)]
    actions = [
        torch.randn(b["input_ids"].shape[0], 4, generator=torch.Generator().manual_seed(i))
        for i, b in enumerate(prompt_batches)
    ]
    den = LossDenominators.from_batches(prompt_batches)

    total = 0.0
    for hidden, batch, logits in zip(hiddens, prompt_batches, actions, strict=True):
        loss = micro_batch_loss(parts_for(hidden, batch, head, logits), den, config, step=5)
        loss.backward()
        total += loss.item()
    accumulated_grad = head.weight.grad.clone()
    head.weight.grad = None

    # The same samples as one batch: pad every micro-batch to the longest and concatenate.
    width = max(b["input_ids"].shape[1] for b in prompt_batches)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        extra = width - t.shape[1]
        return torch.cat([t, torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype)], 1)

    big = {
        "labels": torch.cat([pad(b["labels"], IGNORE_INDEX) for b in prompt_batches]),
        "segment_ids": torch.cat([pad(b["segment_ids"], 0) for b in prompt_batches]),
        "loss_weights": torch.cat([pad(b["loss_weights"], 0.0) for b in prompt_batches]),
        "action_ids": torch.cat([b["action_ids"] for b in prompt_batches]),
    }
    big_hidden = torch.cat([pad(h.detach(), 0.0) for h in hiddens])
    big_loss = micro_batch_loss(
        parts_for(big_hidden, big, head, torch.cat(actions)),
        LossDenominators.from_batches([big]),
        config,
        step=5,
    )
    big_loss.backward()
    assert total == pytest.approx(big_loss.item(), rel=1e-6)
    torch.testing.assert_close(accumulated_grad, head.weight.grad)

    # What the reference trainer did (mean per micro-batch, summed) differs.
    per_micro = sum(
        micro_batch_loss(parts_for(h, b, head, a), LossDenominators.from_batches([b]), config, 5).item()
        for h, b, a in zip(hiddens, prompt_batches, actions, strict=True)
    )
    assert per_micro > 2 * total


def test_denominators_all_reduce_as_a_tensor_sum(sample_index: DatasetIndex) -> None:
    batches = batches_with(sample_index, (2.0, 1.0, 1.0, 3.0))
    rank0 = LossDenominators.from_batches(batches[:2])
    rank1 = LossDenominators.from_batches(batches[2:])
    everything = LossDenominators.from_batches(batches)
    reduced = LossDenominators.from_tensor(rank0.as_tensor() + rank1.as_tensor())
    assert reduced == everything == rank0 + rank1
    assert everything.samples == 5
    counts = torch.cat([count_segment_tokens(b["labels"], b["segment_ids"]) for b in batches]).sum(0)
    # Segment-weighted token counts, less (3 - 1) for the two closing tokens of each of the 5 samples.
    by_segment = float((counts * torch.tensor([2.0, 1.0, 1.0, 3.0])).sum())
    assert everything.weight_sum == pytest.approx(by_segment - 2.0 * 2 * 5)


def test_action_weight_ramps_linearly_from_start_to_end() -> None:
    down = LossConfig(distill_loss_weight=1.0, distill_loss_weight_end=0.2, distill_loss_weight_warmup_steps=100)
    assert [down.distill_weight_at(s) for s in (0, 25, 50, 100, 1000)] == pytest.approx([1.0, 0.8, 0.6, 0.2, 0.2])
    up = LossConfig(distill_loss_weight=0.0, distill_loss_weight_end=0.4, distill_loss_weight_warmup_steps=100)
    assert [up.distill_weight_at(s) for s in (0, 25, 50, 100, 1000)] == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.4])
    # Without both an end and a number of steps the weight stays distill_loss_weight (the reference).
    assert LossConfig(distill_loss_weight=0.4).distill_weight_at(500) == 0.4
    assert LossConfig(distill_loss_weight=0.4, distill_loss_weight_warmup_steps=100).distill_weight_at(50) == 0.4
    assert LossConfig(distill_loss_weight=0.4, distill_loss_weight_end=1.0).distill_weight_at(50) == 0.4


def test_action_term_follows_the_ramp_and_always_reaches_the_action_head(
    prompt_batches: list[dict[str, torch.Tensor]],
) -> None:
    batch = prompt_batches[0]
    config = LossConfig(distill_loss_weight=0.0, distill_loss_weight_end=1.0, distill_loss_weight_warmup_steps=10)
    den = LossDenominators.from_batches([batch])
    head = lm_head()
    action_head = nn.Linear(HIDDEN, 4)
    features = torch.randn(2, HIDDEN)
    hidden = random_hidden(batch, 3)

    def loss_at(step: int) -> torch.Tensor:
        action_head.zero_grad(set_to_none=True)
        loss = micro_batch_loss(parts_for(hidden, batch, head, action_head(features)), den, config, step)
        loss.backward()
        return loss

    token_only = micro_batch_loss(
        parts_for(hidden, batch, head, torch.zeros(2, 4)), den, LossConfig(distill_loss_weight=0.0), step=0
    )
    at_start = loss_at(0)
    assert at_start.item() == pytest.approx(token_only.item())
    assert action_head.weight.grad is not None and (action_head.weight.grad == 0).all()
    action_ce = F.cross_entropy(action_head(features), batch["action_ids"]).item()
    assert loss_at(5).item() == pytest.approx(token_only.item() + 0.5 * action_ce, rel=1e-6)
    assert action_head.weight.grad.abs().sum() > 0


def test_action_cross_entropy_per_sample_and_accuracy() -> None:
    logits = torch.tensor([[4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 4.0]], dtype=torch.bfloat16)
    ce, correct = action_cross_entropy(logits, torch.tensor([0, 1]))
    assert ce.dtype == torch.float32 and correct.tolist() == [True, False]
    torch.testing.assert_close(ce, F.cross_entropy(logits.float(), torch.tensor([0, 1]), reduction="none"))


def test_metric_sums_are_detached_per_segment_totals(prompt_batches: list[dict[str, torch.Tensor]]) -> None:
    batch = prompt_batches[2]
    parts = parts_for(random_hidden(batch, 4), batch, lm_head(), torch.randn(2, 4))
    sums = parts.metric_sums()
    assert sums["segment_ce_sum"].shape == (4,) and not sums["segment_ce_sum"].requires_grad
    assert sums["segment_tokens"].tolist() == parts.segment_tokens.sum(0).double().tolist()
    assert sums["samples"].item() == 2
    assert sums["action_ce_sum"].item() == pytest.approx(parts.action_ce.sum().item())
    assert sums["weighted_ce_sum"].item() == pytest.approx(parts.weighted_ce_sum.sum().item())
    assert not sums["weighted_ce_sum"].requires_grad


def test_labels_and_segments_that_disagree_are_refused(prompt_batches: list[dict[str, torch.Tensor]]) -> None:
    batch = prompt_batches[0]
    segments = batch["segment_ids"].clone()
    first = int((segments[1] > 0).nonzero()[0])
    segments[1, first] = 0
    with pytest.raises(ValueError, match=r"disagree in batch rows \[1\]"):
        count_segment_tokens(batch["labels"], segments)


def test_loss_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="distill_loss_weight must be >= 0"):
        LossConfig(distill_loss_weight=-1.0)
    with pytest.raises(ValueError, match="distill_loss_weight_end must be >= 0"):
        LossConfig(distill_loss_weight_end=-1.0)
    with pytest.raises(ValueError, match="distill_loss_weight_warmup_steps must be >= 0"):
        LossConfig(distill_loss_weight_warmup_steps=-1)
    with pytest.raises(ValueError, match="must be positive"):
        micro_batch_loss(
            LossParts(
                segment_ce_sum=torch.zeros(1, 4),
                segment_tokens=torch.zeros(1, 4, dtype=torch.int64),
                weighted_ce_sum=torch.zeros(1),
                action_ce=torch.zeros(1),
                action_correct=torch.zeros(1, dtype=torch.bool),
                logit_rows=0,
            ),
            LossDenominators(0.0, 1.0),
            LossConfig(),
            step=0,
        )
