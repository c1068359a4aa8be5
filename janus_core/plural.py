"""A count with its noun as a message says it: ``1 sample``, ``2 samples``, ``1 process``."""

from __future__ import annotations

IRREGULAR_VERBS = {"is": "are", "was": "were", "has": "have"}


def plural_of(noun: str) -> str:
    """English plural of ``noun`` (of its last word): ``process`` -> ``processes``, ``entry`` ->
    ``entries``, ``partly filled shard`` -> ``partly filled shards``."""
    head, _, word = noun.rpartition(" ")
    if word.endswith(("s", "x", "ch", "sh")):
        many = word + "es"
    elif word.endswith("y") and word[-2:-1] not in "aeiou":
        many = word[:-1] + "ies"
    else:
        many = word + "s"
    return f"{head} {many}" if head else many


def plural(count: int, noun: str, verb: str = "") -> str:
    """``count`` and ``noun``, plural unless the count is one, and ``verb`` (given as after one
    thing: ``has``, ``is``, ``appears``) agreeing with it: ``plural(1, "sample")`` is ``1 sample``,
    ``plural(3, "process")`` ``3 processes``, ``plural(2, "key", "appears")`` ``2 keys appear``."""
    said = f"{count} {noun if count == 1 else plural_of(noun)}"
    if not verb:
        return said
    return f"{said} {verb if count == 1 else IRREGULAR_VERBS.get(verb, verb.removesuffix('s'))}"
