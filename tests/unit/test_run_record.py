"""A run's recorded profile, as functions: it binds the run only once the
run holds a checkpoint (the run directories of real runs are tests/e2e/test_run_directory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from janus_core.profile import load_profile
from janus_train.config import load_train_settings
from janus_train.run.layout import RunLayout


def test_a_recorded_profile_binds_a_run_only_once_it_holds_a_checkpoint(tmp_path: Path) -> None:
    """A start that failed before its first checkpoint recorded its profile; a corrected profile may
    start the run again. Once a checkpoint exists, the same profile is refused in one line."""
    from janus_core.profile import ProfileError
    from janus_train.run.provenance import run_profile, write_profile

    run = tmp_path / "run"
    variant = load_profile("tiny", ["train.lam=0.3"])
    write_profile(RunLayout(run), variant, load_train_settings(variant))
    assert run_profile(run, None).train["lam"] == 0.3  # the recorded one, without --profile
    assert run_profile(run, "tiny").name == "tiny"  # nothing trained yet: another profile may start it
    RunLayout(run).checkpoints.mkdir()
    RunLayout(run).latest.write_text("step00000002")
    with pytest.raises(ProfileError, match=r"train\.lam is 0\.2, the run's is 0\.3; leave out --profile"):
        run_profile(run, "tiny")
    with pytest.raises(ProfileError, match=r"train\.lam is 0\.4, the run's is 0\.3"):
        run_profile(run, None, ["train.lam=0.4"])
    assert run_profile(run, None, ["train.save_every=5"]).train["save_every"] == 5  # not a model setting
