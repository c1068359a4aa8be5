"""``janus-train show-sample`` on a Qwen3-VL profile: the sample as a Qwen3-VL run trains it.

Its visual tokens per image are those of the frame a Qwen3-VL cache stores (Qwen3-VL's own frame at
the profile's resolution, 32 px per token), and the command prints the description the profile's
prompt builder gives. (The command's process is run in tests/e2e/test_prompt_command.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from janus_core.bases import QWEN3_VL, base_of_qwen_dir
from janus_core.imaging import load_qwen_frame
from janus_core.index import DatasetIndex
from janus_core.profile import load_profile
from janus_train.data.sample_view import describe_sample
from janus_train.build import prompt_builder
from pipelines.train_cli import show_sample_cmd


def test_show_sample_of_a_qwen3_profile_gives_each_image_the_tokens_of_its_stored_frame(
    sample_index: DatasetIndex, sample_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = load_profile("tiny-qwen3")
    assert base_of_qwen_dir(profile.qwen.path) is QWEN3_VL
    sample = sample_index.samples[4]
    builder = prompt_builder(profile)

    frame = load_qwen_frame(sample_index.frames[sample.window_rows[-1]].path, profile.cache.resolution, QWEN3_VL)
    h, w = QWEN3_VL.token_grid(*frame.shape[:2])
    prompt = builder.build_sample(sample)
    assert int((prompt.input_ids == builder.image_token_id).sum()) == len(sample.window) * h * w

    show_sample_cmd(data=sample_dataset, key=sample.key, profile="tiny-qwen3", run=None, overrides=None)
    assert capsys.readouterr().out.rstrip("\n") == describe_sample(builder, sample)
