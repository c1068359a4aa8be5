"""A small local evaluator for ``train.eval_command``: a checkpoint's export, loaded with transformers,
on the run's held-out validation samples, its metrics written as janus's results JSON.

    train:
      eval_command: .venv/bin/python examples/eval/evaluate_export.py --export {export} --run {run} --results {results}
      best_metric: eval/action_accuracy
      best_metric_mode: max

It reads the run's recorded profile (``RUN/profile.yaml``) and first cache (``RUN/run.json``;
``--cache`` names another), loads the export in either format (``janus``: transformers' Qwen class
plus ``janus_heads.safetensors``; ``janusvln``: JanusVLN's reference layout), and runs it on the
samples of the episodes the run holds out (``train.val_episodes``; every sample without a hold-out),
at most ``--max-samples``. The results, best highest unless said otherwise:

* ``action_accuracy``: the share of samples whose action the action head predicts (argmax);
* ``answer_loss``: the mean cross-entropy of the answer's tokens (lowest best);
* ``samples``: how many samples it ran.

It is the shape of any evaluator: read ``{export}``, write a JSON object of numbers to a temporary
file beside ``{results}`` and rename it there (this one: janus's own atomic write), exit 0; on failure exit non-zero (janus names the
code and ``eval.log``). JanusVLN's own Habitat evaluation (SR, SPL, OSR, NE) runs as
``examples/slurm/eval.sbatch``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from janus_core.system.files import atomic_write_bytes


def held_out_rows(run: Path, cache: Path | None, max_samples: int) -> tuple[object, list[int], object]:
    """(dataset, rows to evaluate, prompt builder) of the run's cache, as the run validates it."""
    from janus_train.build import prompt_builder
    from janus_train.config import load_train_settings
    from janus_train.data.from_profile import make_dataset
    from janus_train.loop.validation import plan_validation
    from janus_train.run.provenance import run_profile

    profile = run_profile(run, None, default=None)
    settings = load_train_settings(profile)
    if cache is None:
        cache = Path(json.loads((run / "run.json").read_text())["starts"][-1]["caches"][0]["path"])
    builder = prompt_builder(profile, settings)
    dataset = make_dataset(profile, builder, cache, None, 0, 1)
    _, validation = plan_validation(settings, dataset, None)
    rows = list(validation.rows) if validation is not None else list(range(len(dataset)))
    return dataset, rows[:max_samples], builder


def load_export(export: Path, run: Path) -> torch.nn.Module:
    """The exported model, whichever format janus wrote, with the run's profile (tokenizer, encoder sizes)."""
    from janus_train.checkpoint.export import HEADS_FILE, load_exported
    from janus_train.checkpoint.reference import load_reference_model, run_model_config
    from janus_train.config import load_train_settings
    from janus_train.run.provenance import run_profile

    profile = run_profile(run, None, default=None)
    settings = load_train_settings(profile)
    if (export / HEADS_FILE).is_file():
        return load_exported(export, profile, run_model_config(settings))
    return load_reference_model(export, profile, settings.model_config()).eval()


@torch.no_grad()
def evaluate(export: Path, run: Path, cache: Path | None = None, max_samples: int = 64) -> dict[str, float]:
    from janus_train.data.samples import collate

    model = load_export(export, run)
    dataset, rows, builder = held_out_rows(run, cache, max_samples)
    sums = {"action_correct": 0.0, "samples": 0.0, "ce": 0.0, "tokens": 0.0}
    for row in rows:
        parts = model(collate([dataset[row]], pad_token_id=builder.pad_token_id)).loss_parts.metric_sums()
        sums["action_correct"] += float(parts["action_correct"])
        sums["samples"] += float(parts["samples"])
        sums["ce"] += float(parts["segment_ce_sum"].sum())
        sums["tokens"] += float(parts["segment_tokens"].sum())
    return {"action_accuracy": sums["action_correct"] / max(sums["samples"], 1.0),
            "answer_loss": sums["ce"] / max(sums["tokens"], 1.0), "samples": sums["samples"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, required=True, help="{export}: the checkpoint janus exported")
    parser.add_argument("--run", type=Path, required=True, help="{run}: the run directory")
    parser.add_argument("--results", type=Path, required=True, help="{results}: where the metrics go")
    parser.add_argument("--cache", type=Path, help="a cache to evaluate on (default: the run's first)")
    parser.add_argument("--max-samples", type=int, default=64)
    args = parser.parse_args()
    metrics = evaluate(args.export, args.run, args.cache, args.max_samples)
    atomic_write_bytes(args.results, (json.dumps(metrics) + "\n").encode())  # janus never reads half a file
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
