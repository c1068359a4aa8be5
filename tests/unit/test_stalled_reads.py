"""A read of a cache file that does not return (a stalled network file system or object store) ends
within ``train.read_timeout_s`` as a value naming the file, in the process that waits for it; the
ranks then stop alike (tests/e2e/test_damage_training.py). The stall: a shard replaced by a named pipe
nobody writes to, whose open() waits for a writer as a hung mount waits for its server.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.shared_runs import OneSampleShards
from janus_cache.store.stalls import StalledRead, read_deadline, reading
from janus_core.profile import load_profile
from janus_train.data.damaged import StalledItem, within_read_timeout
from janus_train.data.from_profile import open_training_cache
from janus_train.data.samples import CachedSamples, TrainItem


@pytest.fixture()
def stalled(tmp_path: Path) -> Iterator[Path]:
    """A named pipe; afterwards a writer opens it once, so a read still waiting on it returns (a
    reader thread left blocked would keep this process from exiting)."""
    pipe = tmp_path / "shard"
    os.mkfifo(pipe)
    yield pipe
    try:
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waits on it any more
        pass


def test_a_read_past_its_deadline_is_a_stalled_read_naming_the_file(stalled: Path) -> None:
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(StalledRead) as caught, read_deadline(0.2), reading(stalled):
        open(stalled, "rb")
    assert str(caught.value) == (f"a read of {stalled} has not returned in 0.2 s: a stalled file system or object "
                                 "store (not damage: the file is not rewritten)")
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)  # crosses a loader worker
    assert signal.getsignal(signal.SIGALRM) is before


def test_a_read_within_its_deadline_is_left_alone_and_an_outer_timer_keeps_running(tmp_path: Path) -> None:
    (tmp_path / "shard").write_bytes(b"data")
    runner = signal.setitimer(signal.ITIMER_REAL, 1000)  # an outer timer: a test runner's timeout
    try:
        with read_deadline(5), reading(tmp_path / "shard"):
            assert (tmp_path / "shard").read_bytes() == b"data"
        assert 990 < signal.getitimer(signal.ITIMER_REAL)[0] <= 1000
    finally:
        signal.setitimer(signal.ITIMER_REAL, *runner)


def test_a_sample_whose_feature_shard_stalls_is_a_stalled_item_naming_the_shard_not_damage(
    one_sample_shards: OneSampleShards, stalled: Path, tmp_path: Path,
) -> None:
    """Through the zarr reader, whose damage locating reads a failed shard again: the stall must not
    be taken for damage nor read again without a deadline."""
    from janus_train.build import prompt_builder

    profile = load_profile(one_sample_shards.profile)
    cache = Path(shutil.copytree(one_sample_shards.cache("a"), tmp_path / "cache"))
    reader = open_training_cache(profile, cache).reader
    samples: Any = within_read_timeout(CachedSamples(reader, prompt_builder(profile)), 0.5)
    hung = reader.shard_file(reader.features_array, 1)
    os.replace(stalled, hung)

    assert isinstance(samples[0], TrainItem)
    item = samples[1]
    assert isinstance(item, StalledItem), item
    assert item.error.file == str(hung)
    os.rename(hung, stalled)  # for the fixture's writer
