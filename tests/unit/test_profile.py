"""Profiles: the shipped ones load, every setting has one declaration (its default), and every
wrong or missing setting is named in one line with the file."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from janus_core.profile import (
    PROFILES_DIR,
    CacheSettings,
    EncoderSettings,
    LanguageModelSettings,
    Profile,
    ProfileError,
    load_profile,
)
from janus_core.resolution import Resolution
from janus_core.settings import SettingsError, read_settings, setting
from janus_train.config import TrainSettings, load_train_settings


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
        ({"cache": {"resolution": "pad644", "history": "eight"}}, r"'cache.history' must be an integer, got 'eight'"),
        ({"cache": {"resolution": "pad644", "samples_per_shard": 0}},
         r"'cache.samples_per_shard' is 0; it must be >= 1"),
        ({"cache": {"resolution": "pad644", "histroy": 8}},
         r"unknown setting 'cache.histroy' \(did you mean 'cache.history'\?\)"),
        ({"device": "tpu"}, r"'device' is 'tpu'"),
        ({"compute_dtype": "float16"}, r"'compute_dtype' is 'float16'"),
        ({"learning_rate": 1e-5}, r"unknown setting 'learning_rate'"),
        ({"cache": {}}, r"missing setting 'cache.resolution'"),
        ({"cache": {"resolution": "pad644", "history": 0}}, r"'cache.history' is 0; it must be >= 1"),
        ({"nproc_per_node": True}, r"'nproc_per_node' must be an integer, got True"),
        ({"cache": "pad644"}, r"section 'cache' must be a mapping of settings, got str"),
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


# --- each setting declared once: the train section, the generic reader, the shipped defaults -----


def shipped_tiny(tmp_path: Path, train: dict | None = None, **changes: object) -> Path:
    """The tiny profile with absolute model paths, its train section changed by ``train``."""
    data = tiny_data() | changes
    data["vggt"] = {"config": str(PROFILES_DIR / data["vggt"]["config"]), "seed": 0}
    data["qwen"] = dict(data["qwen"], path=str(PROFILES_DIR / data["qwen"]["path"]))
    data["train"] = dict(data["train"]) | (train or {})
    return write_profile(tmp_path, data)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"num_workers": -1}, r"setting 'train.num_workers' is -1; it must be >= 0"),
        ({"segment_weights": [1, 1, 1]}, r"'train.segment_weights' must be a list of 4 floats, got \[1, 1, 1\]"),
        ({"segment_weights": [1, 0, 1, 3]}, r"'train.segment_weights' is 0.0; it must be > 0.0"),
        ({"distill_weight": 1.0},
         r"unknown setting 'train.distill_weight' \(did you mean 'train.distill_loss_weight'\?\)"),
        ({"distill_loss_weight_end": -1}, r"'train.distill_loss_weight_end' is -1.0; it must be >= 0.0"),
        ({"warmup_ratio": 1.0}, r"'train.warmup_ratio' is 1.0; it must be < 1.0"),
        ({"gradient_checkpointing": "yes"}, r"'train.gradient_checkpointing': expected full, none or every_K \(K >= 1\), got 'yes'"),
        ({"prompt_template": "nowhere.yaml"},
         r"prompt template nowhere.yaml: no file .*known templates: janus.yaml, janusvln.yaml"),
        ({"deepspeed": "zero9.json"}, r"'train.deepspeed' names .*zero9.json, which does not exist"),
    ],
)
def test_wrong_train_settings_are_named_with_the_file(tmp_path: Path, train: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message) as err:
        load_train_settings(load_profile(shipped_tiny(tmp_path, train)))
    assert str(err.value).startswith(str(tmp_path / "p.yaml")) and "\n" not in str(err.value)


def test_every_train_default_is_the_dataclass_field_and_the_reference_launch() -> None:
    """A setting left out takes its one declared default; those defaults are the reference launch."""
    defaults = TrainSettings()
    assert (defaults.micro_batch, defaults.grad_accum, defaults.epochs) == (1, 8, 3)
    assert (defaults.lr_base, defaults.lr_projector, defaults.lr_vision) == (2e-5, 1e-5, 1e-6)
    assert defaults.segment_weights == (1.0, 1.0, 1.0, 1.0)
    assert (defaults.distill_loss_weight, defaults.distill_loss_weight_end) == (1.0, None)
    assert not defaults.loss_config().ramps and defaults.lam == 0.2
    assert (defaults.num_workers, defaults.save_every) == (16, 1000)
    assert (defaults.save_total_limit, defaults.log_every) == (4, 10)
    assert defaults.prompt_template == "janusvln.yaml"
    assert CacheSettings(resolution=Resolution.parse("pad644")).reference_frame == "last"
    empty = Profile(source=Path("p.yaml"), cache=CacheSettings(Resolution.parse("pad644")),
                    vggt=EncoderSettings(), qwen=LanguageModelSettings(path=Path(".")))
    assert load_train_settings(empty) == defaults


def test_h800_trains_with_the_reference_settings(
    monkeypatch: pytest.MonkeyPatch, fake_checkpoints: tuple[Path, Path]
) -> None:
    qwen, vggt = fake_checkpoints
    monkeypatch.setenv("JANUS_QWEN_PATH", str(qwen))
    monkeypatch.setenv("JANUS_VGGT_PATH", str(vggt))
    prof = load_profile("h800")
    settings = load_train_settings(prof)
    assert prof.cache.reference_frame == "last" and prof.cache.history == 8
    # The reference launch, plus validation on 1% of the episodes (the reference has none).
    assert settings == replace(TrainSettings(), alloc_conf="expandable_segments:True", val_episodes_fraction=0.01,
                               val_max_samples=2048, eval_every=1000)


def test_a_profile_without_a_train_section_trains_with_the_defaults(tmp_path: Path) -> None:
    data = {"cache": {"resolution": "pad224"}, "vggt": {"config": str(PROFILES_DIR / "../models/tiny-vggt.json")},
            "qwen": {"path": str(PROFILES_DIR / "../models/tiny-qwen2_5_vl")}}
    prof = load_profile(write_profile(tmp_path, data))
    assert prof.train == {} and prof.name == "p" and prof.nproc_per_node == 1
    assert load_train_settings(prof) == TrainSettings()


def test_env_values_are_parsed_as_the_declared_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKERS", "4")
    monkeypatch.delenv("ACCUM", raising=False)
    path = shipped_tiny(tmp_path, {"num_workers": "${WORKERS}", "grad_accum": "${ACCUM:-3}"})
    settings = load_train_settings(load_profile(path))
    assert (settings.num_workers, settings.grad_accum) == (4, 3)


def test_the_reader_validates_any_settings_dataclass(tmp_path: Path) -> None:
    """The one generic reader: declared defaults, choices, bounds and optional paths."""

    @dataclass(frozen=True)
    class Toy:
        size: int = setting(2, "A size.", min=1)
        mode: str = setting("a", "A mode.", choices=("a", "b"))
        where: Path | None = setting(None, "A path, relative to the file.")

    source = tmp_path / "toy.yaml"
    assert read_settings(Toy, {}, "toy", source) == Toy()
    assert read_settings(Toy, {"where": "x/y"}, "toy", source).where == tmp_path / "x" / "y"
    with pytest.raises(SettingsError, match=r"toy.yaml: setting 'toy.mode' is 'c'; expected one of a, b"):
        read_settings(Toy, {"mode": "c"}, "toy", source)
    with pytest.raises(SettingsError, match=r"unknown setting 'toy.sise' \(did you mean 'toy.size'\?\)"):
        read_settings(Toy, {"sise": 3}, "toy", source)


def test_the_ramp_keys_of_the_train_section_make_the_loss_schedule(tmp_path: Path) -> None:
    ramp = {"distill_loss_weight": 1.0, "distill_loss_weight_end": 0.25, "distill_loss_weight_warmup_steps": 4}
    config = load_train_settings(load_profile(shipped_tiny(tmp_path, ramp))).loss_config()
    assert [config.distill_weight_at(step) for step in range(6)] == [1.0, 0.8125, 0.625, 0.4375, 0.25, 0.25]
    constant = load_train_settings(load_profile(shipped_tiny(tmp_path, {"distill_loss_weight": 0.5}))).loss_config()
    assert not constant.ramps and constant.distill_weight_at(100) == 0.5
