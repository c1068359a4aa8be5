"""Profiles: the shipped ones load, and every wrong or missing setting is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from janus_cache.profile import PROFILES_DIR, ProfileError, load_profile
from janus_cache.resolution import Resolution


def write_profile(tmp_path: Path, data: dict, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def fake_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    """Local model locations as a cluster would have them (contents are not read at load time)."""
    qwen = tmp_path / "Qwen2.5-VL-7B-Instruct"
    qwen.mkdir()
    (qwen / "config.json").write_text("{}")
    vggt = tmp_path / "VGGT-1B"
    vggt.mkdir()
    (vggt / "model.safetensors").write_bytes(b"")
    return qwen, vggt


def tiny_data() -> dict:
    return yaml.safe_load((PROFILES_DIR / "tiny.yaml").read_text())


def test_tiny_profile_loads_with_cpu_fp32_and_random_models() -> None:
    prof = load_profile("tiny")
    assert (prof.device, prof.compute_dtype, prof.nproc_per_node) == ("cpu", "float32", 2)
    assert prof.cache.resolution == Resolution.parse("pad224")
    assert prof.cache.history == 8 and prof.cache.layer == -2
    assert prof.vggt.path is None and prof.vggt.config is not None and prof.vggt.config.is_file()
    assert prof.qwen.random_init and (prof.qwen.path / "config.json").is_file()


def test_h800_profile_names_the_missing_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JANUS_VGGT_PATH", raising=False)
    monkeypatch.delenv("JANUS_QWEN_PATH", raising=False)
    with pytest.raises(ProfileError, match=r"'vggt.path' needs environment variable JANUS_VGGT_PATH"):
        load_profile("h800")


def test_h800_profile_loads_from_local_paths_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, fake_checkpoints: tuple[Path, Path]
) -> None:
    qwen, vggt = fake_checkpoints
    monkeypatch.setenv("JANUS_QWEN_PATH", str(qwen))
    monkeypatch.setenv("JANUS_VGGT_PATH", str(vggt))
    prof = load_profile("h800")
    assert (prof.device, prof.compute_dtype, prof.nproc_per_node) == ("cuda", "bfloat16", 8)
    assert prof.cache.resolution.name == "pad644"
    assert prof.vggt.path == vggt and prof.qwen.path == qwen and not prof.qwen.random_init


def test_h800_profile_rejects_a_qwen_path_without_config(
    monkeypatch: pytest.MonkeyPatch, fake_checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    _, vggt = fake_checkpoints
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("JANUS_QWEN_PATH", str(empty))
    monkeypatch.setenv("JANUS_VGGT_PATH", str(vggt))
    with pytest.raises(ProfileError, match=r"'qwen.path' points to .*empty, which has no config.json"):
        load_profile("h800")


def test_a_vggt_path_that_does_not_exist_is_named(tmp_path: Path, fake_checkpoints: tuple[Path, Path]) -> None:
    qwen, _ = fake_checkpoints
    data = tiny_data() | {"vggt": {"path": str(tmp_path / "nowhere")}, "qwen": {"path": str(qwen)}}
    with pytest.raises(ProfileError, match=r"'vggt.path' points to .*nowhere, which does not exist"):
        load_profile(write_profile(tmp_path, data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cache": {"resolution": "pad644", "reference_frame": "middle"}}, r"'cache.reference_frame' is 'middle'"),
        ({"cache": {"resolution": "pad644", "attention": "sparse"}}, r"'cache.attention' is 'sparse'"),
        ({"cache": {"resolution": "zoom644"}}, r"'cache.resolution'"),
        ({"cache": {"resolution": "pad644", "history": "eight"}}, r"'cache.history' must be int"),
        ({"cache": {"resolution": "pad644", "samples_per_shard": 0}}, r"'cache.samples_per_shard' must be >= 1"),
        ({"cache": {"resolution": "pad644", "histroy": 8}}, r"unknown setting\(s\) cache.histroy"),
        ({"device": "tpu"}, r"'device' is 'tpu'"),
        ({"compute_dtype": "float16"}, r"'compute_dtype' is 'float16'"),
        ({"learning_rate": 1e-5}, r"unknown setting\(s\) learning_rate"),
        ({"cache": {}}, r"missing setting 'cache.resolution'"),
    ],
)
def test_wrong_settings_are_named(tmp_path: Path, change: dict, message: str) -> None:
    data = tiny_data()
    data.update(change)
    # Relative model paths in the shipped profile resolve against its own folder.
    data["vggt"] = {"config": str(PROFILES_DIR / data["vggt"]["config"]), "seed": 0}
    data["qwen"] = dict(data["qwen"], path=str(PROFILES_DIR / data["qwen"]["path"]))
    with pytest.raises(ProfileError, match=message):
        load_profile(write_profile(tmp_path, data))


def test_a_profile_needs_some_vggt_source(tmp_path: Path, fake_checkpoints: tuple[Path, Path]) -> None:
    qwen, _ = fake_checkpoints
    data = tiny_data() | {"vggt": {}, "qwen": {"path": str(qwen)}}
    with pytest.raises(ProfileError, match=r"missing setting 'vggt.path'.*or 'vggt.config'"):
        load_profile(write_profile(tmp_path, data))


def test_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"unknown profile 'h900'.*known profiles: h800, tiny"):
        load_profile("h900")


def test_invalid_yaml_is_reported_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("cache: [unclosed\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: not valid YAML"):
        load_profile(path)
