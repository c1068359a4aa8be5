"""`verify --data` compares a cache with its dataset on columns.

At the real set's 612,560 samples, holding the dataset index as a row object per frame and sample
took rank 0 of `verify --data` to 2.4 GB. The comparison now reads the index the cache's index
store holds, lazily (memory-mapped columns), and matches keys, windows and sources as arrays: no
row is made for an unchanged dataset, and only the changed episode's rows for a changed one.
A real precomputed cache (tiny profile; ``janus-cache precompute``'s CLI run in this process) and a
real PNG dataset on disk.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from helpers.profiles import write_test_profile
from helpers.sources import precompute_in_process, tail
from janus_cache.store import load_manifest
from janus_cache.store.layout import CacheLayout
from janus_cache.verify import check_completeness, dataset_indexes
from janus_core.index import Frame, Sample
from janus_core.index.lazy import LazyIndex, LazyRows
from janus_core.index.text_keys import TextKeys
from janus_core.sample_data import write_sample_data


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(dataset, its cache): three episodes of 4 frames. Read-only (tests edit copies)."""
    root = tmp_path_factory.mktemp("streaming")
    profile = write_test_profile(root / "tiny.yaml")
    data = write_sample_data(root / "data", episodes=3, steps=4, seed=0)
    result = precompute_in_process(root / "cache", profile, data)
    assert result.returncode == 0, tail(result)
    return data, root / "cache"


def index_of(data: Path, cache: Path) -> LazyIndex:
    manifest = load_manifest(cache)
    history = manifest.window.history
    index, _ = dataset_indexes(data, history, history, cache_dir=CacheLayout(cache).index_store,
                               recorded_names=manifest.dataset.sources)
    assert isinstance(index, LazyIndex), "the comparison reads the stored index lazily, not materialised"
    return index


@pytest.fixture
def rows_made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every frame or sample row the lazy index makes: (its class, its row), one per row object."""
    made: list[tuple[str, int]] = []
    make = LazyRows.__getitem__

    def counting(self: LazyRows, item: int | slice) -> object:
        row = make(self, item)
        made.extend((type(one).__name__, one.row) for one in (row if isinstance(item, slice) else (row,))
                    if isinstance(one, (Frame, Sample)))  # episodes are few: made when the index is opened
        return row

    monkeypatch.setattr(LazyRows, "__getitem__", counting)
    return made


def test_an_unchanged_dataset_is_compared_without_making_a_single_row(
        built: tuple[Path, Path], rows_made: list[tuple[str, int]]) -> None:
    data, cache = built
    index = index_of(data, cache)
    rows_made.clear()
    result = check_completeness(cache, index)
    assert result.passed, result.problems
    assert result.data["dataset_compared"] is True and result.data["dataset_identity_matches"] is True
    assert rows_made == [], f"{len(rows_made)} index rows made to compare an unchanged dataset"


def test_a_changed_description_is_named_making_only_the_rows_of_its_episode(
        built: tuple[Path, Path], tmp_path: Path, rows_made: list[tuple[str, int]]) -> None:
    data, cache = built
    copy = Path(shutil.copytree(cache, tmp_path / "cache"))
    edited = min((data.parent / "data").glob("episode_0001/step_0002_*.json"))
    moved = Path(shutil.copytree(data, tmp_path / "data"))
    target = moved / edited.relative_to(data)
    fields = json.loads(target.read_text())
    fields["landmark_description"] = "A staircase that was not there."
    target.write_text(json.dumps(fields))
    index = index_of(moved, copy)
    rows_made.clear()
    result = check_completeness(copy, index)
    assert not result.passed
    assert any("episode_0001" in p and str(target) in p for p in result.problems), result.problems
    episode = index.episode("episode_0001")
    assert rows_made and set(rows_made) <= {("Frame", row) for row in episode.frame_rows} | {
        ("Sample", row) for row in episode.sample_rows}, rows_made


def test_a_lazy_index_is_sent_to_another_process_as_where_it_is_stored(built: tuple[Path, Path]) -> None:
    data, cache = built
    index = index_of(data, cache)
    next(index.iter_text("samples", "key"))  # a decoder made in this process is not sent
    sent = pickle.dumps(index)
    assert len(sent) < 20_000, f"{len(sent)} bytes: the columns were copied"
    received = pickle.loads(sent)
    assert isinstance(received, LazyIndex)
    assert list(received.samples) == list(index.samples) and list(received.frames) == list(index.frames)
    assert received.sample("episode_0002/3") == index.samples[index.episode("episode_0002").sample_rows[-1]]


def test_text_keys_find_rows_of_one_column_in_another_and_name_repeats() -> None:
    cached = TextKeys.of(["ep/0", "ep/1", "ep/2", "ep/1", "é/9"])
    indexed = TextKeys.of(["é/9", "ep/2", "new/0", "ep/0"])
    assert indexed.rows_in(cached).tolist() == [4, 2, -1, 0]
    assert cached.rows_in(indexed).tolist() == [3, -1, 1, -1, 0]
    assert cached.repeated() == ["ep/1"]
    assert TextKeys.of([]).rows_in(cached).tolist() == [] and cached.rows_in(TextKeys.of([])).tolist() == [-1] * 5
    assert indexed.texts([0, 2]) == ["é/9", "new/0"]
