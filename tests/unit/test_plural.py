"""Counts in messages (``janus_core.plural``): the noun, and a verb after it, agree with the count."""

from __future__ import annotations

import pytest

from janus_core.plural import plural


@pytest.mark.parametrize(("count", "noun", "verb", "said"), [
    (1, "sample", "", "1 sample"),
    (0, "sample", "", "0 samples"),
    (2, "process", "", "2 processes"),
    (3, "entry", "", "3 entries"),
    (2, "day", "", "2 days"),
    (2, "shape mismatch", "", "2 shape mismatches"),
    (2, "partly filled shard", "", "2 partly filled shards"),
    (1, "key", "appears", "1 key appears"),
    (4, "key", "appears", "4 keys appear"),
    (2, "sample", "has", "2 samples have"),
    (2, "sample", "is", "2 samples are"),
])
def test_the_noun_and_its_verb_agree_with_the_count(count: int, noun: str, verb: str, said: str) -> None:
    assert plural(count, noun, verb) == said
