"""What a new user meets first on the tiny profile, through the real commands.

* ``janus-train export RUN --format janusvln`` of a tiny run: the profile names no VGGT
  checkpoint (its VGGT is a config with seeded random weights), so the export includes that
  seeded VGGT, says so in one note line, and the directory is the encoder the run's cache was made
  with (``janus-cache verify --checkpoint`` finds it fresh).
* ``make train`` before any precompute: one error line saying that no cache exists at that path
  and which command makes one; ``make verify`` and ``janus-cache verify`` alike.
* A verify that fails one check names it once: ``cache C failed integrity: <the problem>``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers.commands import assert_one_error_line, make
from helpers.damage import flip_byte
from helpers.first_use import JANUS_TRAIN
from helpers.profiles import REPO_ROOT
from helpers.shared_runs import TinyRun, TinyTraining
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


def test_make_verify_before_any_precompute_says_which_cache_it_looked_for(tmp_path: Path) -> None:
    """CACHE defaults to OUT (cache): with neither given and no cache there, make's own line."""
    result = make("verify", OUT=tmp_path / "cache")
    assert result.returncode == 2
    first, *rest = result.stderr.strip().splitlines()
    assert first == (f"make verify: no cache at {tmp_path / 'cache'} (CACHE defaults to OUT={tmp_path / 'cache'}): "
                     "set CACHE=<cache directory> (and DATA=<dataset> for the dataset and live checks)")
    assert all(line.startswith("make: ***") for line in rest), result.stderr
    assert "launcher" not in result.stdout + result.stderr


def test_verify_of_a_cache_not_made_yet_is_one_line(tmp_path: Path) -> None:
    result = run_cli(JANUS_CACHE, "verify", tmp_path / "cache")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: no cache exists at {tmp_path / 'cache'}: make one with `make precompute DATA=<dataset> "
        f"OUT={tmp_path / 'cache'}` (janus-cache precompute <dataset> --out {tmp_path / 'cache'}), or name another "
        "with CACHE=<dir>"]


def test_a_verify_that_fails_one_check_names_it_once(tiny_training: TinyTraining, tmp_path: Path) -> None:
    cache = Path(shutil.copytree(tiny_training.fp32_cache, tmp_path / "cache"))
    shard = next(p for p in sorted((cache / "vggt").rglob("*")) if p.is_file() and p.parent.name != "vggt"
                 and p.name != "zarr.json")
    flip_byte(shard, shard.stat().st_size // 2)
    result = run_cli(JANUS_CACHE, "verify", cache, "--profile", tiny_training.fp32_profile, "--live", "0")
    line = assert_one_error_line(result, f"error: cache {cache} failed integrity: ")
    assert "integrity: integrity" not in line and "failed integrity: integrity" not in line
