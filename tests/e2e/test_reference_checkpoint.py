"""Checkpoints move both ways between janus and the reference JanusVLN trainer,
through the real launches: a damaged ``train.init_from`` refused in one line before starting, and a
2-process ZeRO-3 run from a reference directory exported back to it.

The reference checkpoint directories are built by hand (helpers.reference; session fixtures in
helpers.shared_runs). Import, export and the refusals in one process: tests/unit/test_reference_import.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.reference import LAM, MERGER_HIDDEN, RESOLUTION, damaged, vggt_head_shapes
from janus_train.checkpoint.reference import unused_heads_note


def test_train_refuses_a_damaged_init_from_in_one_line_before_starting(reference_dir: Path, tmp_path: Path) -> None:
    directory = damaged(reference_dir, tmp_path, drop="action_head.0.weight")
    path = write_test_profile(tmp_path / "p.yaml", cache={"resolution": RESOLUTION})
    data = yaml.safe_load(path.read_text())
    data["train"]["init_from"] = str(directory)
    path.write_text(yaml.safe_dump(data))
    result = subprocess.run([sys.executable, "-m", "pipelines.train", "--out", str(tmp_path / "run"),
                             "--cache", str(tmp_path / "no-cache"), "--profile", str(path)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "action_head.0.weight" in result.stderr, result.stderr


# ------------------------------------------------------------- training from it, on 2 ranks


def test_two_process_zero3_run_starts_from_the_directory_and_exports_it_back(reference_dir_with_heads: Path,
                                                                            tmp_path: Path) -> None:
    """``train.init_from`` through the real trainer (2 processes, ZeRO-3 over gloo), at
    learning rate 0 so the weights stay the initial ones; ``janus-train export --format janusvln``
    of its checkpoint then gives back the directory's state dict, tensor for tensor. The directory
    holds VGGT's unused depth and point heads, as every reference checkpoint does: the run says
    once that it ignores them, and the export leaves them out (the reference class only warns)."""
    reference_dir = reference_dir_with_heads
    from typer.testing import CliRunner

    from helpers.training import assert_succeeded, precompute, train_on_ranks, write_train_profile
    from janus_core.sample_data import write_sample_data
    from pipelines.train_cli import app

    zero_lr = {"lr_base": 0.0, "lr_projector": 0.0, "lr_vision": 0.0, "live_check_every": 0, "max_steps": 2,
               "save_every": 2, "init_from": str(reference_dir)}
    profile_path = write_train_profile(tmp_path / "init.yaml", cache={"resolution": RESOLUTION}, train=zero_lr)
    data = write_sample_data(tmp_path / "data", episodes=2, steps=4, seed=0)
    cache = precompute(data, tmp_path / "cache", profile_path)
    run = tmp_path / "run"
    result = train_on_ranks("--out", run, "--cache", cache, "--profile", profile_path, "--no-export")
    assert_succeeded(result)
    notes = [line for line in result.stderr.splitlines() if "depth and point heads" in line]
    assert notes == [unused_heads_note(reference_dir)] and "124 tensors" in notes[0], result.stderr[-3000:]

    out = tmp_path / "janusvln"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out), "--profile", str(profile_path),
                                      "--format", "janusvln", "--vggt", str(reference_dir)])
    assert result.exit_code == 0, result.output
    exported, original = load_file(out / "model.safetensors"), load_file(reference_dir / "model.safetensors")
    original = {key: tensor for key, tensor in original.items() if key not in vggt_head_shapes()}
    assert set(exported) == set(original)
    for key, tensor in original.items():
        assert torch.equal(exported[key], tensor), key
    config = json.loads((out / "config.json").read_text())
    assert (config["lam"], config["vggt_merger_hidden_dim"], config["reference_frame"]) == (LAM, MERGER_HIDDEN, "last")
