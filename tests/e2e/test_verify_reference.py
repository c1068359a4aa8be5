"""``janus-cache verify CACHE --data DATA --live N --checkpoint DIR``: a cache checked against a
reference JanusVLN checkpoint directory.

With ``--checkpoint`` the frozen encoder is the directory's ``vggt.aggregator.*`` (freshness
compares the cache's encoder fingerprint with it, the live check recomputes features with it) and
the fused image embeddings are its vision tower plus ``lam`` times its merger. The directory is
built in the reference layout at tiny sizes by the helpers of ``test_reference_checkpoint``; the
cache is precomputed with ``vggt.path`` naming that same directory (its ``config.json`` carries the
tiny aggregator architecture in an ``aggregator`` section, as the encoder loader reads it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from helpers.forked_ranks import forked_launch
from helpers.model_cases import VGGT_CONFIG
from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.reference import (
    RESOLUTION,
    reference_config,
    reference_shapes,
    vggt_head_shapes,
    write_reference_dir,
)
from janus_cache.store import read_manifest
from janus_core.profile import load_profile
from janus_core.sample_data import write_sample_data
from janus_core.vggt.encoder import EncoderIdentity, load_aggregator
from pipelines import precompute_run

JANUS_CACHE = Path(sys.executable).parent / "janus-cache"


def tiny_reference_dir(path: Path, seed: int) -> Path:
    """A reference checkpoint directory with random weights drawn from ``seed``; its config names
    the tiny aggregator architecture. Like every reference checkpoint it keeps VGGT's (unused)
    depth and point heads."""
    generator = torch.Generator().manual_seed(seed)
    shapes = reference_shapes() | vggt_head_shapes()
    state = {key: 0.05 * torch.randn(shape, generator=generator) for key, shape in shapes.items()}
    config = {**reference_config(), "aggregator": json.loads(VGGT_CONFIG.read_text())}
    return write_reference_dir(path, state, config)


@dataclass(frozen=True)
class Built:
    data: Path
    cache: Path
    profile: Path
    checkpoint: Path
    other_checkpoint: Path
    """The same layout with other random weights (another seed)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("verify-reference")
    checkpoint = tiny_reference_dir(root / "janusvln", seed=1)
    other = tiny_reference_dir(root / "janusvln-other", seed=2)
    profile = write_test_profile(root / "reference.yaml", cache={"resolution": RESOLUTION},
                                 vggt={"path": str(checkpoint), "config": None})
    data = write_sample_data(root / "data", episodes=1, steps=6, seed=0)
    cache = root / "cache"
    assert precompute_run.run(precompute_run.Options(data, cache, profile=str(profile), workers=1)) == 0
    return Built(data, cache, profile, checkpoint, other)


def verify_cli(built: Built, checkpoint: Path, nproc: int | None = None) -> subprocess.CompletedProcess[str]:
    """The real verify command (``janus-cache verify``, or the entry point on ``nproc`` ranks started
    as torchrun starts them, forked from a process that imported it once: helpers.forked_ranks) with
    ``--live 2``, the JSON report on stdout, the table on stderr."""
    args = [built.cache, "--data", built.data, "--profile", built.profile, "--live", "2", "--checkpoint", checkpoint,
            "--json", "-"]
    if nproc is not None:
        return forked_launch("pipelines.verify", *args, nproc=nproc, timeout=300)
    return subprocess.run([str(JANUS_CACHE), "verify", *map(str, args)], cwd=REPO_ROOT, check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_the_cache_is_made_with_the_checkpoints_own_encoder(built: Built) -> None:
    """The precompute read ``vggt.aggregator.*`` of the directory: the cache's fingerprint is that
    of those weights, and the other seed's weights have another one."""
    profile = load_profile(built.profile)
    stored = load_file(built.checkpoint / "model.safetensors")
    model = load_aggregator(profile.vggt, profile.cache.attention)
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, stored[f"vggt.aggregator.{key}"]), key
    fingerprint = read_manifest(built.cache).encoder_fingerprint
    assert fingerprint == EncoderIdentity.of(model).fingerprint
    other = load_profile(write_test_profile(built.profile.parent / "other.yaml", cache={"resolution": RESOLUTION},
                                            vggt={"path": str(built.other_checkpoint), "config": None}))
    assert EncoderIdentity.of(load_aggregator(other.vggt, other.cache.attention)).fingerprint != fingerprint


def test_two_processes_pass_against_the_checkpoint_with_embeddings_compared(built: Built) -> None:
    result = verify_cli(built, built.checkpoint, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["world_size"] == 2
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "schema": "pass", "integrity": "pass", "completeness": "pass", "freshness": "pass", "live": "pass"}
    live = check(report, "live")
    assert live["data"]["checkpoint"] == str(built.checkpoint)
    assert live["data"]["embeddings_note"] == ""
    samples = live["data"]["samples"]
    assert len(samples) == 2 and all(s["embeddings"] is not None for s in samples)
    assert live["data"]["embeddings"]["max_abs"] <= live["data"]["embeddings"]["min_bound"]
    assert "embeddings max abs" in live["detail"] and f"checkpoint {built.checkpoint}" in live["detail"]
    assert check(report, "freshness")["data"]["encoder_source"] == str(built.checkpoint)
    assert "(its 124 unused VGGT depth/point head tensors ignored)" in check(report, "freshness")["detail"]
    assert "verify passed" in result.stderr


def test_another_checkpoint_fails_freshness_on_the_encoder_and_the_live_features(built: Built) -> None:
    result = verify_cli(built, built.other_checkpoint, nproc=1)
    assert result.returncode == 1, result.stderr[-3000:]
    report = json.loads(result.stdout)
    freshness = check(report, "freshness")
    assert freshness["status"] == "fail"
    assert [d["field"] for d in freshness["data"]["differences"]] == ["encoder_fingerprint"]
    assert "encoder_fingerprint" in "\n".join(freshness["problems"])
    live = check(report, "live")
    assert live["status"] == "fail"
    problems = "\n".join(live["problems"])
    assert "VGGT feature max abs error" in problems and "fused embeddings max abs error" in problems
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("encoder_fingerprint" in errors[0] or "freshness" in errors[0]), errors


@pytest.mark.parametrize("damage", ["missing key", "not a directory"])
def test_a_damaged_checkpoint_is_one_line_and_exit_1(built: Built, tmp_path: Path, damage: str) -> None:
    if damage == "missing key":
        state = load_file(built.checkpoint / "model.safetensors")
        del state["merger.mlp.2.bias"]
        config = json.loads((built.checkpoint / "config.json").read_text())
        checkpoint, named = write_reference_dir(tmp_path / "damaged", state, config), "merger.mlp.2.bias"
    else:
        checkpoint = tmp_path / "nowhere"
        checkpoint.write_text("not a checkpoint")
        named = str(checkpoint)
    result = verify_cli(built, checkpoint)  # janus-cache verify: one process, nothing but its own output
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert named in result.stderr
