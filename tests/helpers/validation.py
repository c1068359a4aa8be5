"""The validation tests' settings and data (tests/unit/test_holdout.py, tests/e2e/test_validation.py).

3 episodes x 4 steps of sample data (the session's bfloat16 cache, helpers.shared_runs); the tiny
profile's own validation source (one episode held out) capped at 3 of its 4 samples; 8 training
samples, 4 per step: 2 steps per epoch; 6 steps, validation every 2, a record every 3 steps, a
checkpoint every 2 keeping 1; the best checkpoint by ``val_action_token_accuracy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from helpers.profiles import write_test_profile
from helpers.shared_runs import TinyTraining

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
