"""The validation tests' settings and data (tests/unit/test_holdout.py, tests/e2e/test_validation.py), and
the val_* metrics a run must log, computed by hand (also tests/e2e/test_object_storage.py).

3 episodes x 4 steps of sample data (the session's bfloat16 cache, helpers.shared_runs); the tiny
profile's own validation source (one episode held out) capped at 3 of its 4 samples; 8 training
samples, 4 per step: 2 steps per epoch; 6 steps, validation every 2, a record every 3 steps, a
checkpoint every 2 keeping 1; the best checkpoint by ``val_action_token_accuracy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers.profiles import write_test_profile
from helpers.shared_runs import TinyTraining
from janus_core.index import ACTIONS
from janus_train.data.samples import CachedSamples, collate
from janus_train.data.segments import SEGMENT_NAMES

EPISODES, STEPS = 3, 4
VAL_SAMPLES = 3
MAX_STEPS, RESUMED_STEPS = 6, 8
EVAL_EVERY = 2
LR = 2e-3
TRAIN = {"micro_batch": 1, "grad_accum": 2, "epochs": 100, "max_steps": MAX_STEPS, "lr_base": LR, "lr_projector": LR,
         "warmup_ratio": 0.0, "save_every": 2, "save_total_limit": 1, "log_every": 3, "num_workers": 0,
         "eval_every": EVAL_EVERY, "val_max_samples": VAL_SAMPLES, "best_metric": "val_action_token_accuracy"}
BEST = TRAIN["best_metric"]


def profile_with(path: Path, **train: Any) -> Path:
    """The tiny profile with its validation settings and the test's (absolute model paths)."""
    write_test_profile(path, keep_validation=True)
    data = yaml.safe_load(path.read_text())
    data["train"].update({**TRAIN, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def validation_data(three_episodes: TinyTraining, root: Path) -> dict[str, Path]:
    """The data, the validating profile and the cache (a validating profile trains on the same cache
    settings as the session's bfloat16 cache)."""
    return {"root": root, "data": three_episodes.data, "profile": profile_with(root / "tiny.yaml"),
            "cache": three_episodes.bf16_cache}


def validation_of(built: dict[str, Path]) -> tuple[Any, Any, Any]:
    """The cached dataset, its training part and its validation set, as the trainer plans them."""
    from janus_core.profile import load_profile
    from janus_train.build import prompt_builder
    from janus_train.config import load_train_settings
    from janus_train.data.from_profile import open_training_cache
    from janus_train.data.samples import CachedSamples
    from janus_train.loop.validation import plan_validation

    profile = load_profile(built["profile"])
    dataset = CachedSamples(open_training_cache(profile, built["cache"]).reader, prompt_builder(profile))
    train, validation = plan_validation(load_train_settings(profile), dataset)
    assert validation is not None
    return dataset, train, validation


def hand_metrics(model: torch.nn.Module, dataset: CachedSamples, rows: tuple[int, ...],
                 distill_weight: float) -> dict[str, float]:
    """The val_* metrics of ``model`` over ``rows``, one sample at a time in one process. The action
    name's tokens are found from the text (the tokens of " <ACTION>" just before the closing
    ``<|im_end|>\\n``), and the greedy prediction at each is the argmax of the full LM logits."""
    tokenizer = dataset.builder.tokenizer
    closing = len(tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"])
    weighted = weights = action_ce = head_right = name_right = 0.0
    segment_ce, segment_n = [0.0] * 4, [0] * 4
    for row in rows:
        item = dataset[row]
        batch = collate([item], dataset.builder.pad_token_id)
        with torch.no_grad():
            out = model(batch, return_hidden=True)
            logits = model.qwen.lm_head(out.hidden_states[0]).float()  # [L, vocab]
        labels, seg, w = batch["labels"][0], batch["segment_ids"][0], batch["loss_weights"][0]
        ce = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="none")
        supervised = labels[1:] != -100
        weighted += float((ce * w[1:])[supervised].sum())
        weights += float(w.sum())
        for k in range(4):
            mask = supervised & (seg[1:] == k + 1)
            segment_ce[k] += float(ce[mask].sum())
            segment_n[k] += int(mask.sum())
        head = out.action_logits[0].float()
        action_ce += float(F.cross_entropy(head[None], batch["action_ids"]))
        head_right += float(head.argmax() == batch["action_ids"][0])
        name = tokenizer(" " + ACTIONS[item.prompt.action_id], add_special_tokens=False)["input_ids"]
        end = int(supervised.nonzero().max()) + 2 - closing  # first closing token
        positions = torch.arange(end - len(name), end)
        assert labels[positions].tolist() == name, "the action name is not where the prompt puts it"
        name_right += float(bool((logits[positions - 1].argmax(-1) == labels[positions]).all()))
    n = len(rows)
    token_loss = weighted / weights
    metrics = {"val_loss": token_loss + distill_weight * action_ce / n, "val_token_loss": token_loss,
               "val_action_loss": action_ce / n, "val_action_accuracy": head_right / n,
               "val_action_token_accuracy": name_right / n, "val_samples": n}
    metrics.update({f"val_loss_{s}": segment_ce[k] / segment_n[k] for k, s in enumerate(SEGMENT_NAMES)})
    return metrics


def assert_metrics_equal(logged: dict[str, Any], expected: dict[str, float]) -> None:
    for name, value in expected.items():
        assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
