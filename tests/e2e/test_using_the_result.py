"""docs/train.md's "Using the result" snippet runs as written, on a finished run of the tests (for
``make demo``'s folders, the run and the cache the snippet names): it loads the run's export
(transformers' ``from_pretrained`` and janus's heads) and predicts the next action of the cache's
first sample, the action the trained model itself chose for it at the end of its run."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import torch
from safetensors import safe_open

from helpers.profiles import REPO_ROOT
from helpers.shared_runs import ReferenceRun, TinyTraining
from janus_core.index import ACTIONS

DOCUMENT = REPO_ROOT / "docs" / "train.md"


def the_snippet() -> str:
    """The python block of docs/train.md that loads an export."""
    blocks = re.findall(r"```python\n(.*?)```", DOCUMENT.read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if "load_exported(" in block]
    return snippet


def test_the_documents_inference_snippet_predicts_the_runs_own_action(
        reference_run: ReferenceRun, tiny_training: TinyTraining) -> None:
    snippet = the_snippet()
    assert 'Path("demo_out/tiny/run"), Path("demo_out/tiny/cache")' in snippet  # make demo's folders
    code = snippet.replace('"demo_out/tiny/run"', repr(str(reference_run.out))).replace(
        '"demo_out/tiny/cache"', repr(str(tiny_training.fp32_cache)))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    with safe_open(str(reference_run.outputs), "pt") as recorded:  # the trained engine's outputs, first rows
        keys = json.loads(recorded.metadata()["keys"])
        logits = recorded.get_tensor("action_logits")
    assert result.stdout.splitlines() == [f"{keys[0]} -> {ACTIONS[int(torch.argmax(logits[0]))]}"]
