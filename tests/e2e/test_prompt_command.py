"""The ``janus-train show-sample`` command, as the installed process: it prints the description of
a sample the prompt builder gives (tests/unit/test_prompt.py), and an unknown key is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.model_cases import VISUAL_TOKENS, tiny_tokenizer
from janus_core.index import DatasetIndex
from janus_train.data.prompt import PromptBuilder
from janus_train.data.sample_view import describe_sample


def test_show_sample_prints_the_samples_description_and_names_an_unknown_key(
    sample_index: DatasetIndex, sample_dataset: Path
) -> None:
    sample = sample_index.samples[4]
    lines = describe_sample(PromptBuilder(tiny_tokenizer(), VISUAL_TOKENS), sample).splitlines()
    janus_train = Path(sys.executable).parent / "janus-train"
    shown = subprocess.run([janus_train, "show-sample", "--profile", "tiny", "--data", str(sample_dataset),
                            "--key", sample.key], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:3] == [f"sample {sample.key}", lines[1], lines[2]]
    missing = subprocess.run([janus_train, "show-sample", "--data", str(sample_dataset), "--key", "nowhere/0"],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "nowhere/0" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
