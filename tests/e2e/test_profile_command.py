"""The ``janus-cache profile`` command, as the installed process: it shows a profile's settings and
names a wrong one in one line with the file. (Reading and checking profiles in process:
tests/unit/test_profile.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from helpers.profiles import REPO_ROOT, write_test_profile


def test_the_profile_command_validates_the_train_section_in_one_line(tmp_path: Path) -> None:
    janus_cache = Path(sys.executable).parent / "janus-cache"
    good = subprocess.run([janus_cache, "profile", "tiny"], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert "train: micro-batch 1 x accumulation 2" in good.stdout and "template janusvln.yaml" in good.stdout
    for train, cache, message in (
        ({"num_workers": -1}, {}, "setting 'train.num_workers' is -1; it must be >= 0"),
        ({}, {"history": 0}, "setting 'cache.history' is 0; it must be >= 1"),
    ):
        profile = write_test_profile(tmp_path / "p.yaml", cache=cache)  # tiny, its model paths absolute
        data = yaml.safe_load(profile.read_text())
        data["train"].update(train)
        profile.write_text(yaml.safe_dump(data, sort_keys=False))
        bad = subprocess.run([janus_cache, "profile", str(profile)], capture_output=True, text=True)
        assert bad.returncode == 1 and bad.stdout == ""
        assert bad.stderr.strip().splitlines() == [f"error: {tmp_path / 'p.yaml'}: {message}"]


def test_a_shipped_profile_copied_elsewhere_is_told_to_extend_it_instead(tmp_path: Path) -> None:
    """A copy of configs/profiles/tiny.yaml keeps its relative model paths, which no longer resolve
    from its new folder: the one error line says to write ``extends: tiny`` instead, which works."""
    janus_cache = Path(sys.executable).parent / "janus-cache"
    copy = tmp_path / "mine.yaml"
    copy.write_text((REPO_ROOT / "configs" / "profiles" / "tiny.yaml").read_text())
    refused = subprocess.run([janus_cache, "profile", str(copy)], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"error: {copy}: setting 'vggt.config' points to {tmp_path.parent / 'models' / 'tiny-vggt.json'}, which is "
        f"not a file; a profile copied out of {REPO_ROOT / 'configs' / 'profiles'} keeps its relative paths "
        "(../models/tiny-vggt.json): write 'extends: tiny' and only the settings that differ, instead of a copy"]
    copy.write_text("extends: tiny\ntrain:\n  grad_accum: 4\n")
    extended = subprocess.run([janus_cache, "profile", str(copy)], capture_output=True, text=True)
    assert extended.returncode == 0, extended.stderr
    assert "accumulation 4" in extended.stdout


def test_counts_of_one_are_said_in_the_singular() -> None:
    janus_cache = Path(sys.executable).parent / "janus-cache"
    shown = subprocess.run([janus_cache, "profile", "tiny", "--set", "nproc_per_node=1", "--set", "train.num_workers=1"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "  device cpu, compute dtype float32, 1 process per node" in shown.stdout.splitlines()
    assert shown.stdout.rstrip().endswith(", 1 loader worker")
