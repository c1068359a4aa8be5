"""A cache holding two resolutions trains on the profile's one and verifies.

The way docs/precompute.md gives of adding a resolution: precompute the same data again with another
``--resolution`` (here into a copy of the session's cache, helpers.shared_runs). Then a 2-process
run of ``pipelines.train`` (forked ranks; tiny profile, DeepSpeed ZeRO-3 on the CPU) trains a few
steps on the profile's resolution, and ``janus-cache verify`` (the console script) passes on the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.shared_runs import TinyTraining
from helpers.training import train_on_ranks
from janus_cache.store import read_manifest
from janus_core.profile import load_profile
from janus_core.resolution import Resolution, visual_tokens
from janus_train.data.from_profile import open_training_cache
from janus_train.run.layout import METRICS_FILE
from pipelines.precompute_run import Options, run

OTHER = "pad112"
STEPS = 2
TIMEOUT_S = 400


@pytest.fixture(scope="module")
def two_resolution_cache(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory
                         ) -> tuple[Path, Path, Path]:
    """(data, profile, cache): the session's 8 samples at the profile's resolution (a copy of its
    bfloat16 cache), then precomputed again at pad112 into the same cache."""
    root = tmp_path_factory.mktemp("two-resolutions")
    data = tiny_training.data
    profile = write_test_profile(root / "tiny.yaml")
    settings = yaml.safe_load(profile.read_text())
    settings["train"].update({"micro_batch": 1, "grad_accum": 1, "max_steps": STEPS, "save_every": 0,
                              "log_every": 1, "num_workers": 0, "live_check_every": 0})
    profile.write_text(yaml.safe_dump(settings, sort_keys=False))
    cache = Path(shutil.copytree(tiny_training.bf16_cache, root / "cache"))
    assert run(Options(data, cache, str(profile), resolution=OTHER, workers=1)) == 0
    return data, profile, cache


def test_the_cache_holds_both_resolutions_and_opens_each(two_resolution_cache) -> None:
    _, profile_path, cache = two_resolution_cache
    profile = load_profile(profile_path)
    assert profile.cache.resolution.name == "pad224"
    assert sorted(read_manifest(cache).resolutions) == [OTHER, "pad224"]
    opened = open_training_cache(profile, cache)
    assert opened.resolution == "pad224" and opened.reader[0].frames.shape[1:] == (224, 224, 3)


def test_a_two_resolution_cache_trains_on_the_profiles_resolution(two_resolution_cache, tmp_path: Path) -> None:
    _, profile_path, cache = two_resolution_cache
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", cache, "--profile", profile_path, "--no-export")
    assert result.returncode == 0, f"training failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    records = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # The start line says which of the cache's resolutions trains.
    assert ", frames at pad224, metrics in " in result.stdout
    # 9 images per sample, each with the visual tokens of pad224 (pad112 would have a quarter).
    assert records[0]["visual_tokens_per_sample"] == 9 * visual_tokens(Resolution.parse("pad224"))


def test_janus_cache_verify_passes_on_a_two_resolution_cache(two_resolution_cache) -> None:
    data, profile_path, cache = two_resolution_cache
    console_script = Path(sys.executable).parent / "janus-cache"
    result = subprocess.run([str(console_script), "verify", str(cache), "--data", str(data),
                             "--profile", str(profile_path), "--live", "1"],
                            cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, check=False,
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, f"verify failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_janus_cache_info_opens_every_resolution_and_a_non_cache_is_one_line(two_resolution_cache,
                                                                           tmp_path: Path) -> None:
    _, _, cache = two_resolution_cache
    console_script = Path(sys.executable).parent / "janus-cache"
    info = subprocess.run([str(console_script), "info", str(cache)], capture_output=True, text=True, check=False,
                          timeout=TIMEOUT_S)
    assert info.returncode == 0, info.stderr
    for name in (OTHER, "pad224"):
        assert f"resolution {name}: 8 samples" in info.stdout
    missing = subprocess.run([str(console_script), "info", str(tmp_path)], capture_output=True, text=True,
                             check=False, timeout=TIMEOUT_S)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"error: {tmp_path} is not a janus cache (no manifest.json)"
