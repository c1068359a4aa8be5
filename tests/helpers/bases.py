"""Each base janus supports, as the tests build on it. A test that takes the ``base`` fixture
(tests/conftest.py) runs once per base, on the base's tiny model and profile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from janus_core.bases import QWEN2_5_VL, QWEN3_VL, QwenBase

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"


@dataclass(frozen=True)
class BaseCase:
    """A base, its tiny Qwen directory (both share one tokenizer) and the tiny profile on it."""

    base: QwenBase
    qwen_dir: Path
    profile: str

    def __str__(self) -> str:
        return self.base.model_type


QWEN2_5 = BaseCase(QWEN2_5_VL, MODELS / "tiny-qwen2_5_vl", "tiny")
QWEN3 = BaseCase(QWEN3_VL, MODELS / "tiny-qwen3_vl", "tiny-qwen3")
BASE_CASES: tuple[BaseCase, ...] = (QWEN2_5, QWEN3)
