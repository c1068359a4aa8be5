"""The first build of a stored index holds a chunk of episodes at a time.

Building a 612k-sample index as row objects took the index worker to 2.7 GB. An episode-folder
index is now built a chunk of episode folders at a time straight into its store entry's columns,
and the combined index of a job's sources is written from the parts' stored columns a chunk of
rows at a time; what is read back equals the index built in memory. Real PNG datasets on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import janus_core.index.episode_folders as episode_folders
import janus_core.index.sources as sources_module
from janus_core.index import (
    IndexOptions,
    IndexStore,
    build_index,
    build_sources_index,
    episode_identity,
    store_sources_index,
)
from janus_core.index.cached import COMBINED_PREFIX
from janus_core.index.columns import ColumnWriter
from janus_core.index.lazy import LazyIndex
from janus_core.sample_data import write_sample_data


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five episodes of 4 frames, one of them with a truncated image (a reported problem)."""
    root = write_sample_data(tmp_path_factory.mktemp("chunks") / "data", episodes=5, steps=4, seed=3)
    broken = min((root / "episode_0002").glob("step_0001_*.png"))
    broken.write_bytes(broken.read_bytes()[:200])
    return root


@pytest.fixture
def added(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool]]:
    """Every chunk of rows written to a store entry: (table, rows, whether into a combined entry);
    a build of the whole index in memory fails the test."""
    chunks: list[tuple[str, int, bool]] = []
    add = ColumnWriter.add

    def recording(self: ColumnWriter, table: str, rows: Any) -> None:
        chunks.append((table, len(rows), self.directory.name.startswith(f".{COMBINED_PREFIX}")))
        add(self, table, rows)

    def whole(self: Any) -> None:
        raise AssertionError("the stored index was built whole in memory")

    monkeypatch.setattr(ColumnWriter, "add", recording)
    monkeypatch.setattr(episode_folders.EpisodeFolderBuilder, "build", whole)
    monkeypatch.setattr(episode_folders, "CHUNK_EPISODES", 2)
    return chunks


def test_a_stored_index_is_built_two_episodes_at_a_time_and_reads_back_equal(
        dataset: Path, tmp_path: Path, added: list[tuple[str, int, bool]]) -> None:
    stored = IndexStore(tmp_path / "store").get(IndexOptions(history=8, workers=2).builder(dataset))
    assert not stored.reused and stored.saved
    frames = [n for table, n, _ in added if table == "frames"]
    assert len(frames) == 3 and max(frames) <= 2 * 4, added  # episodes 0-1, 2-3, 4
    expected = _built_in_memory(dataset)
    assert stored.index == expected  # every field: frames, samples, episodes, report (in order), sources
    assert expected.report.entries, "the truncated image is reported"


def _built_in_memory(dataset: Path) -> Any:
    builder = IndexOptions(history=8, workers=2).builder(dataset)
    episodes, frames, samples = [], [], []
    for chunk in builder.build_chunks(episodes_per_chunk=100):
        episodes += chunk[0]
        frames += chunk[1]
        samples += chunk[2]
    return builder.index_of(tuple(episodes), tuple(frames), tuple(samples))


def test_the_combined_index_of_named_sources_is_written_in_chunks_and_equals_the_one_combined_in_memory(
        dataset: Path, tmp_path: Path, added: list[tuple[str, int, bool]], monkeypatch: pytest.MonkeyPatch) -> None:
    other = write_sample_data(tmp_path / "other", episodes=3, steps=3, seed=5)
    sources = [f"r2r={dataset}", f"rxr={other}"]
    monkeypatch.setattr(sources_module, "COMBINE_CHUNK_ROWS", 5)
    stored = store_sources_index(sources, tmp_path / "store")
    index = stored.load()
    assert isinstance(index, LazyIndex)
    parts = [n for _, n, combined in added if not combined]
    combined = [n for _, n, combined in added if combined]
    assert max(parts) <= 2 * 4 and len(combined) > 4 and max(combined) <= 5, added
    monkeypatch.undo()  # the reference: every source built in memory, combined in memory
    expected = build_sources_index(sources)
    assert list(index.frames) == list(expected.frames) and list(index.samples) == list(expected.samples)
    assert index.episodes == expected.episodes and index.report == expected.report
    assert index.sources == expected.sources and index.source_format == expected.source_format
    assert index.samples[0].key.startswith("r2r/") and index.samples[-1].key.startswith("rxr/")
    # the episodes' identities, digested as the rows were written, are those of the rows
    assert index.stored_identities == tuple(episode_identity(expected, e) for e in expected.episodes)



def test_an_index_through_the_store_is_read_lazily_and_summarised_from_its_columns(
        dataset: Path, tmp_path: Path) -> None:
    index = build_sources_index([str(dataset)], cache_dir=tmp_path / "store")
    assert isinstance(index, LazyIndex)
    assert index.summary() == build_index(dataset).summary()
