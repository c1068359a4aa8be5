"""Prompt template files (``configs/prompts/*.yaml``): the system prompt and the user turn's wording.

The default, ``janusvln.yaml``, is the reference JanusVLN text word for word; ``janus.yaml`` is
janus's own wording, an option. A template decides only the wording: labels, loss weights and
segments follow the reference rules whatever the template (see :mod:`janus_train.data.prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from janus_core.profile import CONFIGS_DIR
from janus_core.qwen_vision import DEFAULT_SYSTEM_PROMPT
from janus_core.settings import SettingsError, read_settings, setting

PROMPTS_DIR = CONFIGS_DIR / "prompts"
DEFAULT_TEMPLATE = "janusvln.yaml"
"""The reference JanusVLN wording (docs/train.md "The training sample")."""

IMAGE_TAG = "<image>"
"""How a rendered user text marks an image (the reference's tag)."""


class TemplateError(ValueError):
    """A template file is missing or wrong; the message names the file and the setting."""


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt template file: the system prompt and the user turn's text.

    ``user`` uses ``{history}`` (one ``<image>`` per history image), ``{current}`` (the current
    image) and ``{instruction}``; ``user_without_history`` (optional) replaces it for windows with
    the current image only.
    """

    source: Path = setting(doc="The template file.", yaml=False)
    user: str = setting(doc="The user turn with {history}, {current} and {instruction}.")
    system: str = setting(DEFAULT_SYSTEM_PROMPT, "The system prompt.")
    user_without_history: str = setting("", "The user turn of a window without history (default: user).")

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT_TEMPLATE) -> PromptTemplate:
        """A template file: a path, or a file name under ``configs/prompts/``."""
        path = Path(name_or_path)
        if not path.is_absolute() and not path.is_file():
            path = PROMPTS_DIR / path
        if not path.is_file():
            known = ", ".join(sorted(p.name for p in PROMPTS_DIR.glob("*.yaml")))
            raise TemplateError(f"prompt template {name_or_path}: no file {path} (known templates: {known})")
        try:
            data = yaml.safe_load(path.read_text())
            return read_settings(cls, data, "", path, {"source": path})
        except yaml.YAMLError as err:
            raise TemplateError(f"{path}: not valid YAML: {err}") from None
        except SettingsError as err:
            raise TemplateError(str(err)) from None

    def __post_init__(self) -> None:
        for name in ("user", "user_without_history"):
            text = getattr(self, name)
            if text and "{current}" not in text:
                raise ValueError(f"'{name}' needs the placeholder {{current}}")
            if text and "{instruction}" not in text:
                raise ValueError(f"'{name}' needs the placeholder {{instruction}}")
        try:
            self.user.format(history="", current="", instruction="")
            self.user_without_history.format(current="", instruction="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"a user text has an unknown placeholder or a stray brace: {err}") from None

    def user_text(self, instruction: str, n_history: int) -> str:
        """The user turn, images as ``<image>``."""
        if n_history == 0 and self.user_without_history:
            return self.user_without_history.format(current=IMAGE_TAG, instruction=instruction)
        return self.user.format(history=IMAGE_TAG * n_history, current=IMAGE_TAG, instruction=instruction)
