"""`make demo PROFILE=tiny-qwen3`: sample data -> precompute -> verify -> train -> export on the CPU with
the tiny Qwen3-VL; the export is transformers' own layout (--format janus: JanusVLN's reference
layout is Qwen2.5-VL's). Each profile's demo has its own folder, ``demo_out/PROFILE``: this one
leaves the tiny profile's demo as it was."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from transformers import Qwen3VLForConditionalGeneration

from helpers.profiles import REPO_ROOT
from janus_cache.store import load_manifest
from janus_core.bases import QWEN3_VL
from janus_train.checkpoint.export import HEADS_FILE


def test_make_demo_with_the_qwen3_profile_runs_every_stage_into_its_own_folder_and_exports_a_qwen3_vl_directory(
        tmp_path: Path) -> None:
    root = tmp_path / "demo_out"  # stands for the clone's demo_out/
    demo = root / "tiny-qwen3"
    tiny_demo = root / "tiny" / "cache" / "manifest.json"  # the Qwen2.5-VL demo made before
    tiny_demo.parent.mkdir(parents=True)
    tiny_demo.write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    result = subprocess.run(["make", "--no-print-directory", "demo", "PROFILE=tiny-qwen3", f"DEMO_ROOT={root}"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert tiny_demo.read_text() == "{}"
    assert load_manifest(demo / "cache").base == QWEN3_VL.model_type
    assert (demo / "run" / "metrics.jsonl").is_file()
    _, info = Qwen3VLForConditionalGeneration.from_pretrained(str(demo / "janus"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert (demo / "janus" / HEADS_FILE).is_file() and not (demo / "janusvln").exists()
    assert result.stdout.rstrip().endswith(f"transformers export {demo}/janus")
