"""``janus-train export --format janus`` of each base's run: a directory transformers loads as the
base (Qwen3-VL's DeepStack mergers included) with nothing missing, plus janus's heads, which
``load_exported`` puts back; and ``--format janusvln`` (JanusVLN's Qwen2.5-VL layout) refuses a
Qwen3-VL run. The consolidated ZeRO-3 state is the model's own here (the e2e tier exports real
2-process ZeRO-3 runs: tests/e2e/test_train.py, tests/e2e/test_qwen3_train.py)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch
from transformers import AutoImageProcessor

from helpers.bases import QWEN3, BaseCase
from janus_core.profile import Profile, load_profile
from janus_train.checkpoint.export import HEADS_FILE, QWEN_PREFIX, export, export_janusvln, load_exported
from janus_train.config import load_train_settings
from janus_train.model.janus_model import JanusVLNModel


def trained_state(profile: Profile) -> dict[str, torch.Tensor]:
    """A state that is not the initial one (every weight moved), as a consolidated checkpoint holds it."""
    model = JanusVLNModel.from_profile(profile, load_train_settings(profile).model_config(), device="cpu")
    generator = torch.Generator().manual_seed(7)
    return {name: value + 0.01 * torch.randn(value.shape, generator=generator)
            for name, value in model.state_dict().items()}


def test_an_export_loads_as_its_base_with_nothing_missing_and_its_heads_beside(base: BaseCase, tmp_path: Path
                                                                               ) -> None:
    profile = load_profile(base.profile)
    state = trained_state(profile)
    config = load_train_settings(profile).model_config()
    out = tmp_path / "export"
    with mock.patch("janus_train.checkpoint.export.consolidated_state_dict", return_value=state):
        export(tmp_path / "checkpoints", out, profile, config)

    qwen, info = base.base.transformers_class().from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    loaded = qwen.state_dict()
    deepstack = [k for k in loaded if "deepstack_merger_list" in k]
    assert bool(deepstack) == base.base.deepstack  # Qwen3-VL's own projector, trained with the run
    for name, value in loaded.items():
        assert torch.equal(value, state[QWEN_PREFIX + name]), name
    # The image processor settings the base needs come along (its patch size and mean/std).
    processor = AutoImageProcessor.from_pretrained(str(out))
    assert processor.patch_size == base.base.patch_size and tuple(processor.image_mean) == base.base.image_mean

    # janus's heads load from the same directory, onto a JanusVLNModel of the base.
    model = load_exported(out, profile, config)
    assert model.base is base.base and (out / HEADS_FILE).is_file()
    assert model.state_dict().keys() == state.keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name


def test_the_reference_layout_export_refuses_a_qwen3_vl_run_in_one_line(tmp_path: Path) -> None:
    """--format janusvln is JanusVLN's Qwen2.5-VL layout; a Qwen3-VL run is refused before any
    checkpoint is read, nothing written."""
    profile = load_profile(QWEN3.profile)
    out = tmp_path / "export"
    with pytest.raises(ValueError) as err:
        export_janusvln(tmp_path / "checkpoints", out, profile, load_train_settings(profile), None)
    assert str(err.value) == (
        f"--format janusvln writes JanusVLN's reference checkpoint layout, which is Qwen2.5-VL only, but this run's "
        f"base ({profile.qwen.path}) is Qwen3-VL; export it with --format janus")
    assert not out.exists()
