"""Training levers as settings: the ZeRO stage builds its DeepSpeed
config, the optional fused kernels are refused in one line where their library is missing, and
regional compilation wraps each decoder layer without changing its output. Here: ``make train``
refuses Liger without its package; the rest, in one process, is tests/unit/test_train_levers_config.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers.commands import make
from helpers.profiles import write_test_profile
from janus_train.model.kernels import liger_missing


def profile_with(tmp_path: Path, **train: object) -> Path:
    path = write_test_profile(tmp_path / "levers.yaml")
    data = yaml.safe_load(path.read_text())
    data["train"].update(train)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.skipif(liger_missing() is None, reason="liger-kernel is installed here: the refusal cannot occur")
def test_liger_kernels_without_the_package_are_refused_in_one_line_by_make_train(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, liger_kernels=True)
    result = make("train", PROFILE=profile, CACHE=tmp_path / "cache", RUN=tmp_path / "run", NPROC=1)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    assert "levers.yaml: setting 'train.liger_kernels'" in errors[0] and "pip install liger-kernel" in errors[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
