"""`janus-train export --format janus` of a Qwen3-VL run: a directory transformers loads as
Qwen3-VL (DeepStack mergers included) with nothing missing, plus janus's heads, which
``load_exported`` puts back. The consolidated ZeRO-3 state is the model's own here (the e2e tier
exports a real 2-process ZeRO-3 run: tests/e2e/test_qwen3_train.py)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from transformers import AutoImageProcessor, Qwen3VLForConditionalGeneration

from helpers.profiles import REPO_ROOT, write_test_profile
from janus_core.bases import QWEN3_VL
from janus_core.profile import Profile, load_profile
from janus_train.checkpoint.export import HEADS_FILE, QWEN_PREFIX, export, load_exported
from janus_train.config import load_train_settings
from janus_train.model.janus_model import JanusVLNModel

QWEN3_DIR = REPO_ROOT / "configs" / "models" / "tiny-qwen3_vl"


@pytest.fixture()
def profile(tmp_path: Path) -> Profile:
    path = write_test_profile(tmp_path / "qwen3.yaml")
    data = yaml.safe_load(path.read_text())
    data["qwen"]["path"] = str(QWEN3_DIR)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_profile(path)


def trained_state(profile: Profile) -> dict[str, torch.Tensor]:
    """A state that is not the initial one (every weight moved), as a consolidated checkpoint holds it."""
    model = JanusVLNModel.from_profile(profile, load_train_settings(profile).model_config(), device="cpu")
    generator = torch.Generator().manual_seed(7)
    return {name: value + 0.01 * torch.randn(value.shape, generator=generator)
            for name, value in model.state_dict().items()}


def test_a_qwen3_export_loads_as_qwen3_vl_with_nothing_missing_and_its_heads_beside(
    profile: Profile, tmp_path: Path,
) -> None:
    state = trained_state(profile)
    config = load_train_settings(profile).model_config()
    out = tmp_path / "export"
    with mock.patch("janus_train.checkpoint.export.consolidated_state_dict", return_value=state):
        export(tmp_path / "checkpoints", out, profile, config)

    qwen, info = Qwen3VLForConditionalGeneration.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    loaded = qwen.state_dict()
    deepstack = [k for k in loaded if "deepstack_merger_list" in k]
    assert deepstack  # Qwen3-VL's own projector, trained with the run
    for name, value in loaded.items():
        assert torch.equal(value, state[QWEN_PREFIX + name]), name
    # The image processor settings the base needs come along (Qwen3-VL's patch size and mean/std).
    processor = AutoImageProcessor.from_pretrained(str(out))
    assert processor.patch_size == QWEN3_VL.patch_size and tuple(processor.image_mean) == QWEN3_VL.image_mean

    # janus's heads load from the same directory, onto a Qwen3-VL JanusVLNModel.
    model = load_exported(out, profile, config)
    assert model.base is QWEN3_VL and (out / HEADS_FILE).is_file()
    assert model.state_dict().keys() == state.keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
