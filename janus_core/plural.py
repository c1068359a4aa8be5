"""A count with its noun as a message says it: ``1 sample``, ``2 samples``, ``1 process``."""

from __future__ import annotations

IRREGULAR = {"was": "were", "is": "are", "has": "have", "this": "these"}


def plural_of(noun: str) -> str:
    """English plural of ``noun`` (the last word of it): ``process`` -> ``processes``, ``entry`` ->
    ``entries``, ``shard`` -> ``shards``."""
    head, _, word = noun.rpartition(" ")
    if word in IRREGULAR:
        many = IRREGULAR[word]
    elif word.endswith(("s", "x", "ch", "sh")):
        many = word + "es"
    elif word.endswith("y") and word[-2:-1] not in "aeiou":
        many = word[:-1] + "ies"
    else:
        many = word + "s"
    return f"{head} {many}" if head else many


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, in the plural unless the count is one: ``plural(1, "sample")`` is
    ``1 sample``, ``plural(3, "process")`` is ``3 processes``."""
    return f"{count} {noun if count == 1 else plural_of(noun)}"
