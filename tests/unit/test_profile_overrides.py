"""Profiles without copying YAML: ``--set KEY=VALUE`` on every command that takes a
profile and ``make ... SET="..."``, read by the one profile reader with its one-line errors; and
``extends:`` (a profile name or a path), the child's settings deep-merged over the parent's, each
relative path relative to the file that writes it, a cycle one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers.profiles import REPO_ROOT, TINY_PROFILE
from janus_cache.store import load_manifest
from janus_core.profile import ProfileError, load_profile
from janus_core.sample_data import write_sample_data
from janus_train.config import load_train_settings
from pipelines.cache_cli import app

MODELS = REPO_ROOT / "configs" / "models"


def janus_cache(*args: str | Path) -> tuple[int, str, list[str]]:
    """``janus-cache ARGS`` in this process: (exit code, stdout, stderr lines)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr.strip().splitlines()


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------ --set


def test_set_changes_settings_of_every_section() -> None:
    code, out, _ = janus_cache("profile", "tiny", "--set", "train.grad_accum=4", "--set", "cache.resolution=pad448",
                               "--set", "compute_dtype=bfloat16")
    assert code == 0
    assert "resolution pad448" in out and "accumulation 4" in out and "compute dtype bfloat16" in out
    profile = load_profile("tiny", ["train.grad_accum=4", "train.segment_weights=[1, 2, 3, 4]"])
    settings = load_train_settings(profile)
    assert settings.grad_accum == 4 and settings.segment_weights == (1.0, 2.0, 3.0, 4.0)
    assert profile.overrides == ("train.grad_accum=4", "train.segment_weights=[1, 2, 3, 4]")


def test_set_relative_paths_are_relative_to_the_working_directory(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    shutil.copy(MODELS / "tiny-vggt.json", tmp_path / "my-vggt.json")
    monkeypatch.chdir(tmp_path)
    assert load_profile("tiny", ["vggt.config=my-vggt.json"]).vggt.config == tmp_path / "my-vggt.json"


@pytest.mark.parametrize(("override", "expected"), [
    ("train.grad_acum=4",
     "error: --set train.grad_acum=4: unknown setting 'train.grad_acum' (did you mean 'train.grad_accum'?)"),
    ("cache.resolutoin=pad448",
     "error: --set cache.resolutoin=pad448: unknown setting 'cache.resolutoin' (did you mean 'cache.resolution'?)"),
    ("trian.grad_accum=4", "error: --set trian.grad_accum=4: unknown setting 'trian' (did you mean 'train'?)"),
    ("train.grad_accum=four",
     "error: --set train.grad_accum=four: setting 'train.grad_accum' must be an integer, got 'four'"),
    ("cache.history=0", "error: --set cache.history=0: setting 'cache.history' is 0; it must be >= 1"),
    ("device=tpu", "error: --set device=tpu: setting 'device' is 'tpu'; expected one of cpu, cuda"),
    ("train.grad_accum", "error: --set train.grad_accum: expected KEY=VALUE with a dotted setting name, "
                         "e.g. --set train.grad_accum=4"),
    ("device.kind=cpu", "error: --set device.kind=cpu: 'device' is a setting, not a section of settings"),
])
def test_a_bad_set_is_one_line_naming_it(override: str, expected: str) -> None:
    code, out, err = janus_cache("profile", "tiny", "--set", override)
    assert (code, out, err) == (1, "", [expected])


def test_set_reaches_precompute_and_verify(tmp_path: Path) -> None:
    """A cache precomputed with ``--set cache.resolution=pad112`` holds that resolution; verify with the
    same ``--set`` passes it, verify without it refuses it (the profile's pad224)."""
    data = write_sample_data(tmp_path / "data", episodes=1, steps=3, seed=0)
    cache = tmp_path / "cache"
    code, _, err = janus_cache("precompute", data, "--out", cache, "--set", "cache.resolution=pad112",
                               "--workers", "1")
    assert code == 0, err
    assert list(load_manifest(cache).resolutions) == ["pad112"]
    code, out, _ = janus_cache("verify", cache, "--set", "cache.resolution=pad112", "--live", "0")
    assert code == 0 and "verify passed" in out
    code, _, err = janus_cache("verify", cache, "--live", "0")
    assert code == 1 and any("pad224" in line for line in err)


# --------------------------------------------------------------------------------------- extends


def test_a_profile_in_another_folder_extends_a_named_one(tmp_path: Path) -> None:
    """Tiny's model paths stay relative to tiny.yaml; the child's settings go over tiny's, section by
    section (tiny's other settings kept), and the child is named after its own file."""
    child = write(tmp_path / "elsewhere" / "mine.yaml",
                  {"extends": "tiny", "cache": {"resolution": "pad448"}, "train": {"grad_accum": 4}})
    profile = load_profile(child)
    tiny = load_profile("tiny")
    assert profile.name == "mine" and profile.source == child
    assert (profile.qwen.path, profile.vggt.config) == (MODELS / "tiny-qwen2_5_vl", MODELS / "tiny-vggt.json")
    assert profile.cache.resolution.name == "pad448" and profile.cache.history == tiny.cache.history
    settings, tiny_settings = load_train_settings(profile), load_train_settings(tiny)
    assert settings.grad_accum == 4 and settings.merger_hidden == tiny_settings.merger_hidden
    code, out, _ = janus_cache("profile", child, "--set", "train.grad_accum=8")
    assert code == 0 and "resolution pad448" in out and "accumulation 8" in out


def test_extends_resolves_each_relative_path_relative_to_the_file_that_writes_it(tmp_path: Path) -> None:
    qwen = Path(shutil.copytree(MODELS / "tiny-qwen2_5_vl", tmp_path / "models" / "qwen"))
    parent = write(tmp_path / "team" / "base.yaml", {"extends": str(TINY_PROFILE), "qwen": {"path": "../models/qwen"}})
    child = write(tmp_path / "me" / "child.yaml", {"extends": "../team/base.yaml", "vggt": {"config": "vggt.json"}})
    shutil.copy(MODELS / "tiny-vggt.json", tmp_path / "me" / "vggt.json")
    profile = load_profile(child)
    assert profile.qwen.path == qwen
    assert profile.vggt.config == tmp_path / "me" / "vggt.json"
    assert profile.qwen.random_init  # tiny's, two files up


def test_a_wrong_setting_in_a_parent_names_the_parent(tmp_path: Path) -> None:
    parent = write(tmp_path / "parent.yaml", {"extends": "tiny", "cache": {"history": "eight"}})
    child = write(tmp_path / "sub" / "child.yaml", {"extends": "../parent.yaml"})
    code, _, err = janus_cache("profile", child)
    assert (code, err) == (1, [f"error: {parent}: setting 'cache.history' must be an integer, got 'eight'"])


def test_an_extends_cycle_is_one_line(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = write(tmp_path / "b.yaml", {"extends": "a.yaml"})
    write(a, {"extends": "b.yaml"})
    code, out, err = janus_cache("profile", a)
    assert (code, out, err) == (1, "", [f"error: {a}: 'extends' makes a cycle: {a} -> {b} -> {a}"])
    with pytest.raises(ProfileError, match=r"makes a cycle: .*self\.yaml -> .*self\.yaml$"):
        load_profile(write(tmp_path / "self.yaml", {"extends": "self.yaml"}))


def test_an_unknown_parent_is_one_line(tmp_path: Path) -> None:
    child = write(tmp_path / "child.yaml", {"extends": "h900"})
    code, _, err = janus_cache("profile", child)
    assert code == 1 and len(err) == 1
    assert err[0].startswith(f"error: {child}: setting 'extends' names 'h900', which is neither a file")
    assert "known profiles: " in err[0] and "h800" in err[0] and "tiny" in err[0]


def test_the_index_command_takes_set(tmp_path: Path) -> None:
    data = write_sample_data(tmp_path / "data", episodes=1, steps=3, seed=0)
    code, out, _ = janus_cache("index", data, "--json", "--set", "cache.history=2")
    assert code == 0 and json.loads(out)["samples"] == 3
    code, _, err = janus_cache("index", data, "--set", "cache.history=none")
    assert (code, err) == (1, ["error: --set cache.history=none: setting 'cache.history' must be an integer, "
                               "got 'none'"])
