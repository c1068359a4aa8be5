"""The evaluator of the evaluation tests, run by janus's job as ``train.eval_command``:

    python tests/helpers/scripted_evaluator.py PLAN STEP RESULTS RUN CHECKPOINT [EXPORT]

A real evaluator process: given an export, it loads it with transformers (config and tokenizer as
JanusVLN's evaluation does, then the model through the local example evaluator,
``examples/eval/evaluate_export.py``, which runs it on the run's samples); then it does what the
test's PLAN (a JSON file) says for STEP: ``{"metrics": {...}, "wait": {...}, "exit": CODE, "hand_on":
true}``:

* ``exit``: exit with that code at once (a failing evaluator);
* ``hand_on``: go on in a detached process and exit 0 at once, as ``sbatch`` does;
* ``wait``: until ``{"latest": TAG}`` (the run's ``latest`` names TAG), ``{"starts": N}`` (``run.json``
  records N starts: the run was resumed) or ``{"file": PATH}`` exists, at most :data:`WAIT_S`;
* then write ``metrics`` (plus the example's, and ``checkpoint_present``: whether CHECKPOINT is still
  on disk) to RESULTS, written to a temporary name and renamed, as janus asks of evaluators.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from janus_core.system.files import atomic_write_bytes

WAIT_S = 240.0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eval" / "evaluate_export.py"


def example_evaluator():  # noqa: ANN201 - the example script's module
    spec = importlib.util.spec_from_file_location("evaluate_export", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export_metrics(export: Path, run: Path) -> dict[str, float]:
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(export)
    AutoTokenizer.from_pretrained(export, padding_side="left")
    return example_evaluator().evaluate(export, run, max_samples=2)


def reached(wait: dict, run: Path) -> bool:
    if "latest" in wait:
        latest = run / "checkpoints" / "latest"
        return latest.is_file() and latest.read_text().strip() == wait["latest"]
    if "starts" in wait:
        record = run / "run.json"
        return record.is_file() and len(json.loads(record.read_text())["starts"]) >= wait["starts"]
    return Path(wait["file"]).exists()


def main() -> None:
    plan_file, step, results, run, checkpoint = sys.argv[1:6]
    export = Path(sys.argv[6]) if len(sys.argv) > 6 else None
    plan = json.loads(Path(plan_file).read_text())[step]
    run_dir = Path(run)
    metrics = dict(plan.get("metrics", {}))
    if export is not None:
        metrics.update(export_metrics(export, run_dir))
    if "exit" in plan:
        print(f"scripted evaluator: step {step} fails with code {plan['exit']}", flush=True)
        sys.exit(plan["exit"])
    if plan.get("hand_on") and os.fork() > 0:
        print(f"scripted evaluator: step {step} handed on", flush=True)
        os._exit(0)
    if plan.get("hand_on"):
        os.setsid()  # the detached rest, as a scheduler's job: not the job's child any more
    deadline = time.monotonic() + WAIT_S
    while "wait" in plan and not reached(plan["wait"], run_dir):
        if time.monotonic() > deadline:
            print(f"scripted evaluator: gave up waiting for {plan['wait']}", flush=True)
            sys.exit(4)
        time.sleep(0.1)
    metrics["checkpoint_present"] = float(Path(checkpoint).is_dir())
    atomic_write_bytes(Path(results), json.dumps(metrics).encode())
    print(f"scripted evaluator: wrote {results}", flush=True)


if __name__ == "__main__":
    main()
