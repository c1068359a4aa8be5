"""Each base's facts (janus_core.bases), on the tiny Qwen2.5-VL and Qwen3-VL directories
(configs/models, built offline by tools/tiny_model.py): the base is read from the checkpoint's
config; its facts equal transformers' own; the grid rule pairs a Qwen3-VL frame with VGGT's patch for
patch; only the bases module imports a base's transformers classes.

Qwen3-VL frames are 64x64 (2x2 visual tokens of 32 px); their VGGT features come from the same
source images at pad56 (4x4 VGGT patches, grouped 2x2 into the same 2x2 token grid: the grid rule
of janus_core.bases). The model, prompt, pixel and M-RoPE tests of both bases are in test_model.py,
test_prompt.py, test_imaging.py and test_rope_positions.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoImageProcessor, Qwen3VLConfig
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

from helpers.bases import QWEN2_5, QWEN3, BaseCase
from janus_core.bases import BASES, QWEN2_5_VL, QWEN3_VL, BaseError, base_of_qwen_dir
from janus_core.imaging import load_frame, load_qwen_frame
from janus_core.resolution import Resolution

REPO = Path(__file__).resolve().parents[2]
SIDE = 64  # Qwen3-VL frame side: 4x4 patches of 16 px, 2x2 visual tokens


# ------------------------------------------------------------------------------- the base


def test_the_base_is_the_checkpoint_configs_model_type(tmp_path: Path) -> None:
    assert base_of_qwen_dir(QWEN2_5.qwen_dir) is QWEN2_5_VL
    assert base_of_qwen_dir(QWEN3.qwen_dir) is QWEN3_VL
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(BaseError) as err:
        base_of_qwen_dir(tmp_path)
    assert str(err.value) == (f"{tmp_path / 'config.json'}: model_type 'llava' is not a base janus supports; "
                              "expected one of qwen2_5_vl (Qwen2.5-VL), qwen3_vl (Qwen3-VL)")
    with pytest.raises(BaseError, match=r"no such file; 'qwen.path' must be a Qwen2.5-VL or Qwen3-VL directory"):
        base_of_qwen_dir(tmp_path / "missing")


def test_each_bases_facts_are_transformers_own(base: BaseCase) -> None:
    qwen_dir, facts = base.qwen_dir, base.base
    assert base_of_qwen_dir(qwen_dir) is facts
    config = AutoConfig.from_pretrained(qwen_dir)
    vision = config.vision_config
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (
        facts.patch_size, facts.merge_size, facts.temporal_patch)
    processor = AutoImageProcessor.from_pretrained(qwen_dir)
    assert (processor.patch_size, processor.merge_size, processor.temporal_patch_size) == (
        facts.patch_size, facts.merge_size, facts.temporal_patch)
    assert tuple(processor.image_mean) == facts.image_mean and tuple(processor.image_std) == facts.image_std
    assert facts.transformers_class().config_class.model_type == facts.model_type == config.model_type
    assert facts.transformers_class("inner").get_rope_index is not None
    assert isinstance(facts.transformers_class("vision")(vision), torch.nn.Module)
    assert hasattr(vision, "deepstack_visual_indexes") == facts.deepstack


def test_the_tiny_qwen3_shares_the_tiny_tokenizer_and_both_deepstack_layers_reach_the_loss() -> None:
    """Built offline from code (the byte-for-byte check of both tiny directories: test_tiny_model.py):
    the tiny Qwen2.5-VL's tokenizer, Qwen3-VL's template and config."""
    assert (QWEN3.qwen_dir / "tokenizer.json").read_bytes() == (QWEN2_5.qwen_dir / "tokenizer.json").read_bytes()
    config = AutoConfig.from_pretrained(QWEN3.qwen_dir)
    assert list(config.vision_config.deepstack_visual_indexes) == [0, 1]
    assert config.text_config.num_hidden_layers == 3  # DeepStack's two layers both reach the loss


def test_qwen3_vl_facts_are_the_defaults_of_its_transformers_config() -> None:
    """16-px patches, 2x2 merge (32 px per token), 2 frames per patch, DeepStack."""
    defaults = Qwen3VLVisionConfig()
    assert (defaults.patch_size, defaults.spatial_merge_size, defaults.temporal_patch_size) == (16, 2, 2)
    assert (QWEN3_VL.patch_size, QWEN3_VL.merge_size, QWEN3_VL.temporal_patch, QWEN3_VL.token_pixels) == (16, 2, 2, 32)
    assert QWEN3_VL.patch_dim == 3 * 2 * 16 * 16 and QWEN3_VL.image_mean == QWEN3_VL.image_std == (0.5, 0.5, 0.5)
    assert list(defaults.deepstack_visual_indexes) == [8, 16, 24] and QWEN3_VL.deepstack
    assert set(BASES) == {"qwen2_5_vl", "qwen3_vl"}


def test_the_8b_architecture_is_stored_as_shapes_only() -> None:
    """configs/models/qwen3_vl_8b: Qwen3-VL-8B-Instruct's config (no weights) for the FLOP count."""
    directory = REPO / "configs" / "models" / "qwen3_vl_8b"
    assert sorted(p.name for p in directory.iterdir()) == ["config.json"]
    config = AutoConfig.from_pretrained(directory)
    assert isinstance(config, Qwen3VLConfig) and base_of_qwen_dir(directory) is QWEN3_VL
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        4096, 36, 32, 8)
    assert (vision.depth, vision.hidden_size, vision.out_hidden_size) == (27, 1152, 4096)
    assert list(vision.deepstack_visual_indexes) == [8, 16, 24]


# --------------------------------------------------------------------------------- the grids


def test_vggt_runs_at_its_own_resolution_whose_grouped_grid_is_qwen3s_token_grid() -> None:
    """The grid rule: Qwen3-VL at pad{T}, VGGT at pad{T*14/16}; both grids T/16 patches a side."""
    assert QWEN3_VL.vggt_side(640) == 560 and QWEN3_VL.vggt_side(SIDE) == 56
    assert QWEN3_VL.token_grid(640, 640) == (20, 20)
    assert QWEN3_VL.vggt_grid(640, 640) == Resolution.parse("pad560").patch_grid() == (40, 40)
    assert QWEN3_VL.vggt_grid(SIDE, SIDE) == Resolution.parse("pad56").patch_grid() == (4, 4)
    assert QWEN3_VL.token_grid(96, 128) == (3, 4) and QWEN3_VL.vggt_grid(96, 128) == (6, 8)
    # Qwen2.5-VL shares VGGT's 14-px patches: one resolution for both models.
    assert QWEN2_5_VL.vggt_side(644) == 644 and QWEN2_5_VL.vggt_grid(644, 644) == (46, 46)
    with pytest.raises(ValueError, match="a Qwen3-VL frame side must be a positive multiple of 32 px, got 644"):
        QWEN3_VL.vggt_side(644)
    with pytest.raises(ValueError, match=r"frame size 56x56 \(HxW\) is not whole Qwen3-VL visual tokens"):
        QWEN3_VL.patch_grid(56, 56)


def test_a_qwen3_frame_covers_the_source_as_its_vggt_frame_does_patch_for_patch() -> None:
    """Pad and crop, landscape and portrait: the same preprocessing with every side counted in
    16-px instead of 14-px patches, so white padding and content span the same patches."""
    for size, resolution in (((640, 480), "pad56"), ((480, 640), "pad560"), ((640, 480), "crop224"),
                             ((641, 479), "pad644")):
        rng = np.random.default_rng(size[0])
        source = Image.fromarray(rng.integers(0, 250, (size[1], size[0], 3), dtype=np.uint8))  # never white
        vggt, qwen = load_frame(source, resolution), load_qwen_frame(source, resolution, QWEN3_VL)
        assert qwen.dtype == np.uint8 and qwen.shape == (vggt.shape[0] // 14 * 16, vggt.shape[1] // 14 * 16, 3)
        for axis in (0, 1):
            white_v = (vggt == 255).all(axis=(1 - axis, 2))
            white_q = (qwen == 255).all(axis=(1 - axis, 2))
            assert int(white_v.sum()) / 14 == int(white_q.sum()) / 16
            assert int(np.argmin(white_v)) / 14 == int(np.argmin(white_q)) / 16  # first content row/column
    assert load_qwen_frame(source, "pad56", QWEN2_5_VL).tobytes() == load_frame(source, "pad56").tobytes()
    assert QWEN3_VL.token_grid(*load_qwen_frame(source, "pad644", QWEN3_VL).shape[:2]) == (23, 23)


# ------------------------------------------------------------------------- one place per base

# Modules that still import a base's transformers classes themselves, each Qwen2.5-VL only for a
# reason; the rest of janus reaches a base through janus_core.bases. A new module that imports
# them fails here.
QWEN2_5_ONLY: dict[str, str] = {
    "janus_train/checkpoint/export.py": "--format janusvln writes JanusVLN's reference config, Qwen2.5-VL's by definition",
    "janus_train/checkpoint/reference.py": "JanusVLN's reference checkpoint layout is Qwen2.5-VL's by definition",
    "janus_train/model/janus_model.py": "JanusVLN's VGGT merger normalises with Qwen2.5-VL's RMSNorm, whatever the base",
}


def _imports_a_base_class(source: str) -> bool:
    import ast
    import re

    name = re.compile(r"^(Qwen2_5_VL|Qwen2_5_Vision|Qwen3VL)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if re.search(r"\bqwen(2_5|3)_vl\b", node.module or "") or any(name.match(a.name) for a in node.names):
                return True
        elif isinstance(node, ast.Import) and any(re.search(r"\bqwen(2_5|3)_vl\b", a.name) for a in node.names):
            return True
    return False


def test_only_the_bases_module_imports_a_bases_transformers_classes() -> None:
    importers = sorted(
        path.relative_to(REPO).as_posix()
        for directory in ("janus_core", "janus_cache", "janus_train", "pipelines", "benchmarks", "tools")
        for path in (REPO / directory).rglob("*.py")
        if _imports_a_base_class(path.read_text(encoding="utf-8"))
    )
    assert importers == sorted(QWEN2_5_ONLY), "import the base's classes through janus_core.bases.QwenBase"
