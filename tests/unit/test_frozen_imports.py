"""A command's heavy imports run with the collector paused and end frozen (``pipelines.frozen_imports``);
the collector is on again afterwards, however the block ends, unless it was off before."""

from __future__ import annotations

import gc
import weakref

import pytest

from pipelines.frozen_imports import frozen_imports


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_no_collection_runs_in_the_block_and_what_it_made_is_frozen_with_the_collector_on_after() -> None:
    before = gc.get_freeze_count()
    with frozen_imports():
        assert not gc.isenabled()
        cycle = Node()
        alive = weakref.ref(cycle)
        del cycle
        made = [Node() for _ in range(20 * gc.get_threshold()[0])]  # enough to trigger collections
        assert alive() is not None, "a collection ran inside the block"
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(made)
    gc.collect()
    assert alive() is not None, "a frozen object was collected"


def test_the_collector_is_on_again_when_the_block_raises() -> None:
    with pytest.raises(ImportError), frozen_imports():
        raise ImportError("no module named 'missing'")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with frozen_imports():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
