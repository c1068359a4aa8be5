"""Validation: the model's losses and accuracies over a validation set, with no update.

A run validates on one source (``train`` settings): another cache (``val_cache``) or episodes of the
training data held out whole (``val_episodes`` / ``val_episodes_fraction``, :mod:`janus_train.data.holdout`;
the training sampler then sees only the other episodes' rows). The hold-out works on every kind of
training data: a zarr cache or live data (the rows split), a webdataset cache (the training stream
passes the held-out rows over unread, the validation stream reads only them, both split over ranks
and workers by the stream's one split) and a mixture (each cache holds out its own episodes by the
same seeded rule). Every ``eval_every`` optimizer steps and at the end, every rank runs its share of
the validation rows (:func:`janus_cache.store.split.share`; a stream: the rows of its shards) in
eval mode; the sums are all-reduced and then divided, so each metric is the exact average over
all validation samples:

* ``val_loss``: ``val_token_loss + d * val_action_loss``, the training loss's formula (``d``: the
  action-head weight of the step just run);
* ``val_token_loss``: the loss-weighted token CE (``sum w_t CE_t / sum w_t``), as training weighs it;
* ``val_loss_<segment>``: mean token CE of each answer line (:data:`janus_train.data.segments.SEGMENT_NAMES`);
* ``val_action_loss`` / ``val_action_accuracy``: the action head's CE and argmax accuracy;
* ``val_action_token_accuracy``: the share of samples whose action name after ``ACTION:`` the language
  model predicts token for token (argmax of the LM logits at each of its supervised positions, the
  answer before it given): what a greedy decoder would write there, without a generation loop;
* ``val_samples``: how many samples were averaged.

ZeRO-3 gathers weights collectively, so every rank runs the same number of forward passes: a rank
with fewer rows repeats its first row in an extra micro-batch whose results are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset

from janus_cache.store.layout import SAMPLES_TABLE
from janus_cache.store.records import EPISODE_COLUMN
from janus_cache.store.split import epoch_order, share
from janus_core.plural import plural
from janus_core.qwen_vision import IM_END
from janus_train.config import TrainSettings
from janus_train.data.damaged import DamagedSample, StalledSample, stalled_message, within_read_timeout
from janus_train.data.holdout import Holdout, HoldoutError, heldout_count, split_by_episode
from janus_train.data.mixture import MixedSamples
from janus_train.data.prompt import PromptBuilder
from janus_train.data.samples import CachedSamples, LiveSamples, StreamedSamples, TrainItem, collate
from janus_train.data.segments import ANSWER_LABELS, N_SEGMENTS, SEGMENT_NAMES
from janus_train.data.val_metric_names import VAL_LOSS
from janus_train.data.workers import worker_start

_ACTION_SEGMENT = N_SEGMENTS  # segment ids are 1-based; the action line is the last
_SUMS = ("weighted_ce_sum", "weight_sum", "action_ce_sum", "action_correct", "action_token_correct", "samples")


class ValidationError(ValueError):
    """The run's validation source cannot be used; the message says why (one line)."""


@dataclass(frozen=True)
class ValidationSet:
    """The rows of a dataset to validate on (all ranks' together) and what they are; a stream
    (:class:`StreamedSamples`) yields exactly ``rows``, split over ranks by its shards."""

    dataset: Dataset[TrainItem]
    rows: tuple[int, ...]
    description: str


def episode_ids(dataset: Dataset[TrainItem]) -> list[str]:
    """The episode id of each sample row of one training source (a cache of either format, or live data)."""
    if isinstance(dataset, (CachedSamples, StreamedSamples)):
        return [str(e) for e in dataset.reader.read_column(SAMPLES_TABLE, EPISODE_COLUMN)]
    if isinstance(dataset, LiveSamples):
        return [sample.episode_id for sample in dataset.index.samples]
    raise ValidationError(f"cannot hold out episodes of a {type(dataset).__name__}: set train.val_cache instead")


def held_out(settings: TrainSettings, dataset: Dataset[TrainItem], source: str = "") -> Holdout:
    """``dataset``'s rows split by the run's hold-out settings (the seeded rule of :mod:`janus_train.data.holdout`);
    ``source``: the cache's name in a mixture, for the message."""
    episodes = episode_ids(dataset)
    try:
        count = heldout_count(len(set(episodes)), settings.val_episodes, settings.val_episodes_fraction)
        return split_by_episode(episodes, count, settings.seed)
    except HoldoutError as err:
        where = f"cache {source!r}: " if source else ""
        raise ValidationError(f"train.val_episodes / val_episodes_fraction: {where}{err}") from None


def _episodes(count: int) -> str:
    return plural(count, "held-out episode")


def capped_rows(rows: Sequence[int], max_samples: int, seed: int) -> tuple[int, ...]:
    """At most ``max_samples`` of ``rows`` (0: all): a seeded choice, the same at every evaluation,
    spread over the episodes rather than the first ones."""
    if not max_samples or len(rows) <= max_samples:
        return tuple(rows)
    return tuple(sorted(rows[i] for i in epoch_order(len(rows), seed, 0)[:max_samples]))


def plan_validation(settings: TrainSettings, dataset: Dataset[TrainItem],
                    val_dataset: Dataset[TrainItem] | None = None) -> tuple[Dataset[TrainItem], ValidationSet | None]:
    """The dataset to train on and the validation set of a run.

    ``val_dataset``: the opened ``val_cache`` (when set); otherwise a hold-out of ``dataset``'s
    episodes (the returned training dataset is then the other rows, a :class:`Subset`), or no
    validation at all.
    """
    if val_dataset is not None:
        if isinstance(val_dataset, StreamedSamples):
            raise ValidationError(f"train.val_cache {settings.val_cache} is a webdataset cache; validation reads "
                                  "a zarr cache (random access)")
        rows = capped_rows(range(len(val_dataset)), settings.val_max_samples, settings.seed)
        return dataset, ValidationSet(val_dataset, rows, f"{plural(len(rows), 'sample')} of {settings.val_cache}")
    if not (settings.val_episodes or settings.val_episodes_fraction):
        return dataset, None
    if isinstance(dataset, MixedSamples):  # each cache holds out its own episodes
        holdouts = [held_out(settings, part, name) for name, part in zip(dataset.names, dataset.datasets)]
        train = MixedSamples(dataset.names, [Subset(part, list(h.train_rows))
                                             for part, h in zip(dataset.datasets, holdouts)])
        flat = [int(dataset.offsets[i]) + row for i, h in enumerate(holdouts) for row in h.val_rows]
        rows = capped_rows(flat, settings.val_max_samples, settings.seed)
        per_cache = ", ".join(f"{name} {len(h.val_episodes)}" for name, h in zip(dataset.names, holdouts))
        return train, ValidationSet(dataset, rows, f"{plural(len(rows), 'sample')} of "
                                    f"{_episodes(sum(len(h.val_episodes) for h in holdouts))} ({per_cache})")
    holdout = held_out(settings, dataset)
    rows = capped_rows(holdout.val_rows, settings.val_max_samples, settings.seed)
    description = f"{plural(len(rows), 'sample')} of {_episodes(len(holdout.val_episodes))}"
    if isinstance(dataset, StreamedSamples):  # two streams of the one cache, each passing the other's rows over
        def stream(keep: Sequence[int]) -> StreamedSamples:
            return StreamedSamples(dataset.reader, dataset.builder, dataset.rank, dataset.world, rows=keep)

        return stream(holdout.train_rows), ValidationSet(stream(rows), rows, description)
    return Subset(dataset, list(holdout.train_rows)), ValidationSet(dataset, rows, description)


@dataclass(frozen=True)
class ActionSpan:
    """Where the action name lies among a sample's action-segment labels: after the ``ACTION:``
    marker's tokens and before the closing ``<|im_end|>\\n`` (counts of tokens)."""

    marker_tokens: int
    closing_tokens: int

    @classmethod
    def of(cls, builder: PromptBuilder) -> ActionSpan:
        def count(text: str) -> int:
            return len(builder.tokenizer(text, add_special_tokens=False)["input_ids"])

        return cls(count(ANSWER_LABELS[-1]), count(f"{IM_END}\n"))

    def positions(self, segment_ids: torch.Tensor) -> list[torch.Tensor]:
        """Per sample of a collated micro-batch, the positions [k] of its action name's tokens."""
        spans = []
        for row in segment_ids:
            action = (row == _ACTION_SEGMENT).nonzero().flatten()
            spans.append(action[self.marker_tokens : len(action) - self.closing_tokens])
        return spans


def action_tokens_correct(hidden: torch.Tensor, labels: torch.Tensor, spans: list[torch.Tensor],
                          lm_head_weight: torch.Tensor) -> torch.Tensor:
    """bool [B]: the LM's argmax at every action-name token of each sample equals its label
    (position t's token is predicted by the hidden state at t - 1)."""
    correct = []
    for b, span in enumerate(spans):
        if len(span) == 0:
            raise ValueError("a sample's action line holds no action-name token")
        h = hidden[b, span.to(hidden.device) - 1]
        logits = torch.nn.functional.linear(h, lm_head_weight.to(h.dtype)).float()
        correct.append(bool((logits.argmax(-1).cpu() == labels[b, span]).all()))
    return torch.tensor(correct)


class Evaluator:
    """Evaluates a ZeRO-3 engine on a validation set; every rank builds one and calls
    :meth:`evaluate` together (``rank`` of ``world``; ``num_workers`` loader processes)."""

    def __init__(self, validation: ValidationSet, builder: PromptBuilder, micro_batch: int, num_workers: int,
                 rank: int, world: int, device: torch.device, damaged_samples: str, read_timeout_s: float) -> None:
        if not validation.rows:
            raise ValidationError(f"the validation set ({validation.description}) is empty")
        self.validation, self.micro_batch, self.num_workers = validation, micro_batch, num_workers
        self.device, self.pad_token_id = device, builder.pad_token_id
        dataset = validation.dataset
        self.stream = dataset if isinstance(dataset, StreamedSamples) else None
        if self.stream is not None:  # each rank reads the validation rows of its shards
            per_rank = max(len(self.stream.rank_rows(r)) for r in range(world))
            self.rows = self.stream.rank_rows(rank)
        else:
            per_rank = math.ceil(len(validation.rows) / world)
            self.rows = share(validation.rows, rank, world)
        self.n_batches = math.ceil(per_rank / micro_batch)  # the same on every rank
        self.world, self.damaged_samples, self.read_timeout_s = world, damaged_samples, read_timeout_s
        self.span = ActionSpan.of(builder)

    def _loaded(self) -> Iterator[dict[str, Any]]:
        """This rank's validation micro-batches."""
        collate_fn = partial(collate, pad_token_id=self.pad_token_id)
        if self.stream is None:
            rows = within_read_timeout(Subset(self.validation.dataset, list(self.rows)), self.read_timeout_s)
            yield from DataLoader(rows, batch_size=self.micro_batch, collate_fn=collate_fn, num_workers=self.num_workers,
                                  generator=torch.Generator(),  # keeps the run's RNG
                                  **worker_start(self.num_workers))
            return
        # A stream's workers each read whole shards: batched here, so a rank's micro-batches are
        # ceil(rows / micro_batch) whatever the number of workers (n_batches counts on it).
        items: list[Any] = []
        for item in DataLoader(within_read_timeout(self.stream, self.read_timeout_s), batch_size=None,
                               num_workers=self.num_workers, **worker_start(self.num_workers)):
            items.append(item)
            if len(items) == self.micro_batch:
                yield collate_fn(items)
                items = []
        if items:
            yield collate_fn(items)

    def _filler(self) -> dict[str, Any]:
        """An uncounted micro-batch of one validation sample (for a rank with fewer batches)."""
        if self.stream is None:
            item = self.validation.dataset[self.validation.rows[0]]
        else:  # the first validation sample of the whole stream (one rank, no workers)
            whole = StreamedSamples(self.stream.reader, self.stream.builder, 0, 1, rows=self.stream.rows)
            item = next(iter(whole))
        return collate([item], pad_token_id=self.pad_token_id)

    def _batches(self) -> Iterator[tuple[dict[str, Any], bool]]:
        """This rank's micro-batches, then uncounted fillers up to ``n_batches``: (batch, counted)."""
        done = 0
        for batch in self._loaded():
            done += 1
            yield batch, True
        filler = None
        while done < self.n_batches:
            filler = filler or self._filler()
            done += 1
            yield filler, False

    @torch.no_grad()
    def evaluate(self, engine: Any, lm_head: torch.nn.Module, distill_weight: float) -> dict[str, float]:
        """The ``val_*`` metrics of the engine's current weights (eval mode; the mode is restored)."""
        import deepspeed

        sums = torch.zeros(len(_SUMS) + 2 * N_SEGMENTS, dtype=torch.float64)
        was_training = engine.training
        engine.eval()
        try:
            skipped = 0
            for batch, counted in self._batches():
                batch, counted, damaged = self._readable(batch, counted)
                skipped += damaged
                out = engine(batch, return_hidden=True)
                with deepspeed.zero.GatheredParameters([lm_head.weight]):
                    tokens_ok = action_tokens_correct(out.hidden_states, batch["labels"],
                                                      self.span.positions(batch["segment_ids"]), lm_head.weight)
                if not counted:
                    continue
                parts = {name: value.cpu() for name, value in out.loss_parts.metric_sums().items()}
                sums += torch.cat([
                    torch.stack([parts["weighted_ce_sum"], batch["loss_weights"].double().sum(),
                                 parts["action_ce_sum"], parts["action_correct"],
                                 tokens_ok.double().sum(), parts["samples"]]),
                    parts["segment_ce_sum"], parts["segment_tokens"],
                ])
        finally:
            engine.train(was_training)
        sums = sums.to(self.device)
        dist.all_reduce(sums)
        metrics = val_metrics(sums.cpu(), distill_weight)
        if skipped:
            metrics["val_damaged_skips"] = skipped
        return metrics

    def _readable(self, batch: dict[str, Any], counted: bool) -> tuple[dict[str, Any], bool, int]:
        """(micro-batch to run, counted, damaged samples all ranks left out of it), every rank agreeing
        on the damage (a rank never stops alone while the others wait in the model's collectives).
        ``train.damaged_samples: stop`` raises :class:`DamagedSample` on every rank; ``skip`` leaves
        them out, a micro-batch left empty replaced by an uncounted filler. A read that stalled past
        ``train.read_timeout_s`` raises :class:`StalledSample` on every rank."""
        damaged, stalled = batch.pop("damaged", []), [str(err) for err in batch.pop("stalled", [])]
        if "keys" not in batch and not stalled:
            batch, counted = self._filler(), False
            damaged = damaged + batch.pop("damaged", [])
        agreed = torch.tensor([float(len(damaged)), float("keys" not in batch), float(len(stalled))],
                              dtype=torch.float64, device=self.device)
        dist.all_reduce(agreed)
        total, unusable = int(agreed[0].item()), bool(agreed[1].item())
        if agreed[2].item():  # never skipped: the next read would wait on the same file system
            per_rank: list[Any] = [None] * self.world
            dist.all_gather_object(per_rank, stalled)
            raise StalledSample(stalled_message("validation", per_rank))
        if total and (self.damaged_samples == "stop" or unusable):
            per_rank = [None] * self.world
            dist.all_gather_object(per_rank, [str(err) for err in damaged])
            rank = next(r for r, lines in enumerate(per_rank) if lines)
            why = ("stopped on every rank, train.damaged_samples: skip would leave them out"
                   if self.damaged_samples == "stop" else "no readable validation sample is left to run")
            raise DamagedSample(f"validation, rank {rank}: {per_rank[rank][0]} ({plural(total, 'damaged validation sample')}; "
                                f"{why})")
        return batch, counted, total


def val_metrics(sums: torch.Tensor, distill_weight: float) -> dict[str, float]:
    """The ``val_*`` record from the all-reduced sums (:data:`_SUMS`, then per-segment CE and tokens)."""
    values = dict(zip(_SUMS, sums[: len(_SUMS)].tolist()))
    segment_ce = sums[len(_SUMS) : len(_SUMS) + N_SEGMENTS].tolist()
    segment_tokens = sums[len(_SUMS) + N_SEGMENTS :].tolist()
    samples = values["samples"]
    token_loss = values["weighted_ce_sum"] / values["weight_sum"]
    action_loss = values["action_ce_sum"] / samples
    record = {
        VAL_LOSS: token_loss + distill_weight * action_loss,
        "val_token_loss": token_loss,
        "val_action_loss": action_loss,
        "val_action_accuracy": values["action_correct"] / samples,
        "val_action_token_accuracy": values["action_token_correct"] / samples,
        "val_samples": int(samples),
    }
    for name, ce, n in zip(SEGMENT_NAMES, segment_ce, segment_tokens):
        record[f"val_loss_{name}"] = ce / n if n else None
    return record
