"""What a new user meets first on the tiny profile, through the real commands.

* ``janus-train export RUN --format janusvln`` of a tiny run: the profile names no VGGT
  checkpoint (its VGGT is a config with seeded random weights), so the export includes that
  seeded VGGT, says so in one note line, and the directory is the encoder the run's cache was made
  with (``janus-cache verify --checkpoint`` finds it fresh).
* ``make train`` before any precompute: one error line saying that no cache exists at that path
  and which command makes one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers.commands import assert_one_error_line, make
from helpers.first_use import JANUS_TRAIN
from helpers.profiles import REPO_ROOT
from helpers.shared_runs import TinyRun
from helpers.training import write_train_profile
from janus_core.profile import load_profile
from janus_core.vggt.encoder import load_aggregator

JANUS_CACHE = Path(sys.executable).parent / "janus-cache"


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_janusvln_export_of_a_tiny_run_holds_the_profiles_seeded_vggt(tiny_run: TinyRun, tmp_path: Path) -> None:
    out = tmp_path / "janusvln"
    result = run_cli(JANUS_TRAIN, "export", tiny_run.run, "--out", out, "--profile", tiny_run.profile,
                     "--format", "janusvln")
    assert result.returncode == 0, result.stderr[-3000:]
    profile = load_profile(tiny_run.profile)
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "names no vggt.path" in notes[0], result.stderr
    assert str(profile.vggt.config) in notes[0] and "seed 0" in notes[0] and "--vggt PATH" in notes[0]
    # The note and the summary line, none of DeepSpeed's converter chatter.
    assert result.stderr.splitlines() == notes
    assert result.stdout.splitlines() == [f"exported {tiny_run.run / 'checkpoints'} to {out}"]

    stored = load_file(out / "model.safetensors")
    encoder = load_aggregator(profile.vggt, profile.cache.attention).state_dict()
    assert {k for k in stored if k.startswith("vggt.")} == {f"vggt.aggregator.{k}" for k in encoder}
    for key, tensor in encoder.items():
        assert torch.equal(stored[f"vggt.aggregator.{key}"], tensor), key
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "Qwen2_5_VLForConditionalGenerationForJanusVLN"]

    # The exported encoder is the one the run's cache was made with.
    verify = run_cli(JANUS_CACHE, "verify", tiny_run.cache, "--profile", tiny_run.profile, "--checkpoint", out,
                     "--json", "-")
    assert verify.returncode == 0, verify.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(verify.stdout)["checks"]}
    assert checks["freshness"]["status"] == "pass" and checks["freshness"]["data"]["encoder_source"] == str(out)


def test_make_train_before_any_precompute_says_no_cache_is_there_and_how_to_make_one(tmp_path: Path) -> None:
    profile = write_train_profile(tmp_path / "tiny.yaml")
    cache = tmp_path / "cache"
    result = make("train", CACHE=cache, RUN=tmp_path / "run", PROFILE=profile, NPROC=1)
    line = assert_one_error_line(result, f"no cache exists at {cache}",
                                 f"make one with `make precompute DATA=<dataset> OUT={cache}`")
    assert "failed schema" not in line and not cache.exists()
