"""Each constant has one home: each base model's facts (Qwen2.5-VL, Qwen3-VL), the actions, the
window's reference frames and attention modes, the dtype names and the device of a process are
defined once and imported everywhere else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from janus_core.dtypes import DTYPE_NAMES, TORCH_DTYPES, dtype_name
from janus_core.system.device import DEVICES, process_device

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("janus_core", "janus_cache", "janus_train", "pipelines", "benchmarks", "tools")

# (what, pattern of a definition, the one file allowed to hold it)
HOMES: tuple[tuple[str, str, str], ...] = (
    ("Qwen special tokens",  # a name bound to a token's literal
     r"""^\s*\w+\s*(:[^=]*)?=\s*["']<\|(endoftext|im_start|im_end|vision_start|vision_end|image_pad|video_pad)"""
     r"""\|>["']""",
     "janus_core/qwen_vision.py"),
    ("Qwen patch geometry",  # module constants, or a base's fields set to a number (janus_core.bases)
     r"^\s*(PATCH_SIZE|MERGE_SIZE|SPATIAL_MERGE_SIZE|TEMPORAL_PATCH\w*|PATCH_DIM)\s*[:=]"
     r"|^\s*(patch_size|merge_size|temporal_patch)\s*=\s*\d",
     "janus_core/bases.py"),
    ("CLIP mean/std", r"0\.48145466|0\.26862954", "janus_core/bases.py"),
    ("base model types", r"[\"'](qwen2_5_vl|qwen3_vl)[\"']", "janus_core/bases.py"),
    ("actions", r"^\s*ACTIONS\b\s*[:=]", "janus_core/index/model.py"),
    ("reference frames", r"^\s*REFERENCE_FRAMES\b\s*[:=]|\(\s*\"first\",\s*\"last\"\s*\)",
     "janus_core/windows.py"),
    ("attention modes", r"^\s*ATTENTION_MODES\b\s*[:=]|\(\s*\"causal\",\s*\"full\"\s*\)", "janus_core/windows.py"),
    ("dtype name maps",  # STORED_DTYPES is the store's on-disk representation, another fact
     r"\"bfloat16\":\s*torch\.bfloat16|^\s*(?!STORED_)\w*DTYPES\b\s*[:=].*\"float32\"", "janus_core/dtypes.py"),
    ("device of a process", r"[\"']cuda:[{\"']|f\"cuda:\{", "janus_core/system/device.py"),
    ("device names", r"^\s*DEVICES\b\s*[:=]", "janus_core/system/device.py"),
)


def _sources() -> dict[str, str]:
    return {
        path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
        for directory in SOURCE_DIRS
        for path in sorted((REPO / directory).rglob("*.py"))
    }


@pytest.mark.parametrize(("what", "pattern", "home"), HOMES, ids=[h[0] for h in HOMES])
def test_a_constant_is_defined_only_in_its_home(what: str, pattern: str, home: str) -> None:
    regex = re.compile(pattern, re.MULTILINE)
    sources = _sources()
    assert regex.search(sources[home]), f"{what}: not found in its home {home}"
    elsewhere = sorted(name for name, text in sources.items() if name != home and regex.search(text))
    assert elsewhere == [], f"{what} defined outside {home}: {elsewhere}"


def test_the_device_of_a_process_is_the_cpu_or_the_gpu_of_its_local_rank() -> None:
    assert DEVICES == ("cpu", "cuda")
    assert process_device("cpu", local_rank=3) == torch.device("cpu")
    assert process_device("cuda", local_rank=3) == torch.device("cuda", 3)
    assert process_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, got 'gpu'"):
        process_device("gpu")


def test_dtype_names_map_to_torch_dtypes_and_back() -> None:
    assert DTYPE_NAMES == ("float32", "bfloat16")
    assert [dtype_name(TORCH_DTYPES[name]) for name in DTYPE_NAMES] == list(DTYPE_NAMES)
    with pytest.raises(ValueError, match="dtype torch.float16 has no name; expected one of float32, bfloat16"):
        dtype_name(torch.float16)
