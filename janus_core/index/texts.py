"""How a text field of the dataset becomes the text of a sample (both input formats).

The reference trainer's rule (docs/train.md "The training sample"): surrounding whitespace is stripped,
inner newlines are kept, and a text given as a JSON list uses its first element.
"""

from __future__ import annotations


def normalise_text(value: object) -> str | None:
    """The sample text of a JSON value, or ``None`` when it is missing, empty or not text."""
    if isinstance(value, list):
        value = value[0] if value else None
    if not isinstance(value, str):
        return None
    return value.strip() or None
