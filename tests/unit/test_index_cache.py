"""The stored dataset index: the same index as a fresh build, reused without opening a source file
while the dataset's files keep their sizes and mtimes, and rebuilt reading only what changed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from helpers.dataset_files import age, images, scramble_keeping_size_and_mtime
from janus_core.index import (
    DatasetError,
    DatasetIndex,
    IndexStore,
    Reason,
    build_index,
    build_sources_index,
    build_stored_index,
    episode_identities,
    load_stored,
    store_sources_index,
)
from janus_core.index.columns import INDEX_SCALARS
from janus_core.index.episode_folders import EpisodeFolderBuilder

EP, OTHER = "episode_0000", "episode_0001"


@pytest.fixture
def dataset(dataset_copy: Path) -> Path:
    """A private copy of the sample dataset whose files were last modified an hour ago."""
    age(dataset_copy)
    return dataset_copy


def assert_same_index(a: DatasetIndex, b: DatasetIndex) -> None:
    assert a == b  # every field: frames, samples, episodes, report, history, rule, source
    assert a.frames == b.frames and a.samples == b.samples and a.episodes == b.episodes


def test_the_stored_index_equals_a_fresh_build(dataset: Path, tmp_path: Path) -> None:
    fresh = build_index(dataset)
    stored = build_stored_index(dataset, tmp_path / "store")
    assert not stored.reused and stored.saved and stored.checked == len(fresh.frames)
    assert_same_index(stored.index, fresh)
    reused = build_stored_index(dataset, tmp_path / "store")
    assert reused.reused and reused.checked == 0 and reused.entry == stored.entry
    assert_same_index(reused.index, fresh)
    # What another process of a job reads: the columns of the entry, by its fingerprint.
    assert_same_index(load_stored(stored.entry, stored.fingerprint, dataset), fresh)


def test_a_lazily_read_index_gives_the_same_rows_lookups_and_summary(dataset: Path, tmp_path: Path) -> None:
    fresh = build_index(dataset)
    stored = build_stored_index(dataset, tmp_path / "store")
    lazy = load_stored(stored.entry, stored.fingerprint, dataset, lazy=True)
    assert isinstance(lazy, DatasetIndex) and len(lazy.frames) == len(fresh.frames)
    assert lazy.frames[-1] == fresh.frames[-1] and lazy.frames[2:5] == fresh.frames[2:5]
    assert lazy.samples == fresh.samples and lazy.frames == fresh.frames and lazy.episodes == fresh.episodes
    key = fresh.samples[7].key
    assert lazy.sample(key) == fresh.sample(key) and lazy.window(lazy.sample(key)) == fresh.window(fresh.sample(key))
    assert lazy.frames_of(OTHER) == fresh.frames_of(OTHER) and lazy.frame(EP, 3) == fresh.frame(EP, 3)
    assert lazy.summary() == fresh.summary() and lazy.source_identity() == fresh.source_identity()
    with pytest.raises(IndexError):
        lazy.frames[len(fresh.frames)]


def test_the_stored_index_of_several_sources_is_read_lazily_and_reused_until_a_source_changes(
    dataset: Path, tmp_path: Path
) -> None:
    """What every precompute rank reads: the combined index of named sources, equal row for row and
    column for column to the index built in memory, reused while no source changed."""
    other = tmp_path / "other"
    shutil.copytree(dataset, other)
    age(other)
    sources = [f"r2r={dataset}", f"rxr={other}"]
    fresh = build_sources_index(sources)
    stored = store_sources_index(sources, tmp_path / "store")
    assert not stored.reused
    lazy = stored.load()
    for name in ("source", "source_format", "history", "frames", "samples", "episodes", "report",
                 "subinstruction_rule", "sources"):
        assert getattr(lazy, name) == getattr(fresh, name), name
    assert lazy.samples[-1].key.startswith("rxr/") and lazy.samples[-1].source == "rxr"
    # The episodes' identities are stored with it (a resume compares them with its cache's).
    assert lazy.stored_identities is not None and episode_identities(lazy) == episode_identities(fresh)
    for table, name in (("samples", "window_rows"), ("samples", "step"), ("frames", "width"), ("frames", "index")):
        assert (lazy.int_column(table, name) == fresh.int_column(table, name)).all(), (table, name)
    for table, name in (("samples", "key"), ("samples", "instruction"), ("frames", "sha256"), ("frames", "relpath")):
        assert lazy.text_column(table, name) == fresh.text_column(table, name), (table, name)
    again = store_sources_index(sources, tmp_path / "store")
    assert again.reused and again.entry == stored.entry and again.fingerprint == stored.fingerprint
    scramble_keeping_size_and_mtime([next((other / EP).glob("*.json"))])
    os.utime(next((other / EP).glob("*.json")), ns=(0, 0))  # the stat now differs: a changed source
    changed = store_sources_index(sources, tmp_path / "store")
    assert not changed.reused and changed.entry == stored.entry and changed.fingerprint != stored.fingerprint
    with pytest.raises(ValueError, match="changed or is incomplete"):
        stored.load()  # a handle of the old index never reads the new one
    grown = store_sources_index([*sources, f"more={other}"], tmp_path / "store")  # a source appended
    assert grown.entry != stored.entry and grown.load().samples[-1].source == "more"
    assert [p.name for p in (tmp_path / "store").glob("sources-*")] == [grown.entry.name]


def test_the_stored_index_keeps_problems_windows_and_settings(dataset: Path, tmp_path: Path) -> None:
    """A damaged dataset (unreadable image, empty description) under other settings: the report,
    the shorter history and the janus rule come back as built; settings are keyed apart."""
    (dataset / OTHER / sorted(os.listdir(dataset / OTHER))[0]).write_bytes(b"not a png")
    description = next((dataset / EP).glob("step_0003_*.json"))
    description.write_text(json.dumps({"landmark_description": "", "spatial_description": "x"}))
    age(dataset)
    store = tmp_path / "store"
    for kwargs in ({"history": 3, "subinstruction_rule": "janus"}, {"check_images": False}, {}):
        fresh = build_index(dataset, **kwargs)
        assert fresh.report.entries, "the damage is reported"
        build_stored_index(dataset, store, **kwargs)
        again = build_stored_index(dataset, store, **kwargs)
        assert again.reused
        assert_same_index(again.index, fresh)
    assert len(os.listdir(store)) == 3
    with pytest.raises(DatasetError, match="strict mode"):
        build_stored_index(dataset, store, strict=True)


def test_an_index_stored_before_the_shared_domain_moved_to_janus_core_is_reused_as_written(
        dataset: Path, tmp_path: Path) -> None:
    """Indexes stored by an earlier janus (in a cache, or the index store) pickled their index-wide
    values (the problem report among them) under ``janus_cache.index``; such an entry is still
    reused, not rebuilt, and reads back equal to a fresh build."""
    (dataset / OTHER / sorted(os.listdir(dataset / OTHER))[0]).write_bytes(b"not a png")
    age(dataset)
    fresh = build_index(dataset)
    assert fresh.report.entries
    stored = build_stored_index(dataset, tmp_path / "store")
    scalars = stored.entry / INDEX_SCALARS
    values = pickle.loads(scalars.read_bytes())
    old = pickle.dumps(values, protocol=0).replace(b"janus_core.index", b"janus_cache.index")  # text opcodes
    assert b"janus_cache.index.problems" in old and b"janus_core" not in old
    scalars.write_bytes(old)
    again = build_stored_index(dataset, tmp_path / "store")
    assert again.reused and again.checked == 0
    assert_same_index(again.index, fresh)


def test_a_relative_source_path_gives_relative_frame_paths_as_a_fresh_build(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_stored_index(dataset, tmp_path / "store")
    monkeypatch.chdir(dataset.parent)
    relative = Path(dataset.name)
    again = build_stored_index(relative, tmp_path / "store")
    assert again.reused
    assert again.index.frames[0].path == relative / EP / again.index.frames[0].path.name
    assert_same_index(again.index, build_index(relative))


def test_an_unchanged_dataset_is_not_read_again(dataset: Path, tmp_path: Path) -> None:
    """Every image scrambled behind the index's back (same size, same mtime): the reused index
    still has the original hashes and no problem, so no image was opened."""
    first = build_stored_index(dataset, tmp_path / "store")
    scramble_keeping_size_and_mtime(images(dataset))
    again = build_stored_index(dataset, tmp_path / "store")
    assert again.reused and again.checked == 0
    assert_same_index(again.index, first.index)
    assert build_index(dataset).frames == (), "a fresh build reads them: none is an image now"


def test_a_changed_image_is_the_only_file_read_and_hashed_again(dataset: Path, tmp_path: Path) -> None:
    first = build_stored_index(dataset, tmp_path / "store")
    changed = next((dataset / EP).glob("step_0005_*.png"))
    replacement = next(f for f in first.index.frames if f.episode_id == OTHER and f.step == 2)
    new_bytes = replacement.path.read_bytes()
    scramble_keeping_size_and_mtime([p for p in images(dataset) if p != changed])
    changed.write_bytes(new_bytes)  # another frame's picture: new size, content and mtime
    age(changed, seconds=60)
    again = build_stored_index(dataset, tmp_path / "store")
    assert not again.reused and again.checked == 1
    assert again.index.report.entries == ()  # the scrambled files were not read
    row = next(f.row for f in first.index.frames if f.path == changed)
    assert (again.index.frames[row].nbytes, again.index.frames[row].sha256) == (len(new_bytes), replacement.sha256)
    assert [f for f in again.index.frames if f.row != row] == [f for f in first.index.frames if f.row != row]
    third = build_stored_index(dataset, tmp_path / "store")
    assert third.reused and third.index == again.index


def test_a_file_modified_moments_before_indexing_is_read_again_next_time(dataset: Path, tmp_path: Path) -> None:
    """Its mtime may stay put through a quick second change of the same size (coarse file
    timestamps): such a file is not trusted by size and mtime until it is older."""
    first = build_stored_index(dataset, tmp_path / "store")
    fresh = next((dataset / EP).glob("step_0002_*.png"))
    fresh.write_bytes(fresh.read_bytes())  # same bytes, mtime now
    second = build_stored_index(dataset, tmp_path / "store")
    assert not second.reused and second.checked == 1 and second.index == first.index
    scramble_keeping_size_and_mtime([fresh])  # changed within the same mtime
    third = build_stored_index(dataset, tmp_path / "store")
    assert not third.reused and third.checked == 1
    assert fresh not in [f.path for f in third.index.frames], "the scrambled file was read and refused"


def test_an_edited_description_is_read_again_and_the_images_are_not(dataset: Path, tmp_path: Path) -> None:
    build_stored_index(dataset, tmp_path / "store")
    scramble_keeping_size_and_mtime(images(dataset))
    description = next((dataset / EP).glob("step_0004_*.json"))
    data = json.loads(description.read_text())
    data["landmark_description"] = "An edited description."
    description.write_text(json.dumps(data))
    again = build_stored_index(dataset, tmp_path / "store")
    assert not again.reused and again.checked == 0
    assert again.index.sample(f"{EP}/4").description_2d == "An edited description."
    assert again.index.report.entries == ()


def test_new_and_removed_episodes_and_files_are_seen(dataset: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = build_stored_index(dataset, store)
    shutil.copytree(dataset / OTHER, dataset / "episode_0009")
    grown = build_stored_index(dataset, store)
    assert not grown.reused and len(grown.index.episodes) == len(first.index.episodes) + 1
    assert grown.checked == len(grown.index.frames_of("episode_0009"))  # only the new episode's images
    (dataset / "episode_0010").mkdir()  # an empty folder is reported by the builder: a change
    empty = build_stored_index(dataset, store)
    assert not empty.reused and empty.index.report.by_reason(Reason.MISSING_MILESTONES)
    shutil.rmtree(dataset / "episode_0010")
    next((dataset / EP).glob("step_0011_*.png")).unlink()
    shrunk = build_stored_index(dataset, store)
    assert not shrunk.reused and shrunk.checked == 0
    assert_same_index(shrunk.index, build_index(dataset))


def test_new_images_are_checked_by_worker_processes(dataset: Path, tmp_path: Path) -> None:
    builder = EpisodeFolderBuilder(dataset, 8, True, 1, "reference")
    stored = IndexStore(tmp_path / "store", prefill_min_files=1).get(builder, processes=2)
    assert stored.checked == len(images(dataset)) and builder.inspected == []  # none in the builder
    assert_same_index(stored.index, build_index(dataset))


def test_an_annotation_file_index_is_stored_and_follows_its_images(dataset: Path, tmp_path: Path) -> None:
    index = build_index(dataset)
    records = [{"id": s.key, "instruction": s.instruction, "subinstruction": s.subinstruction,
                "2D_description": s.description_2d, "3D_description": s.description_3d, "action": s.action,
                "images": [f.relpath for f in index.window(s)]} for s in index.samples]
    records.append({**records[0], "id": "needs-a-missing-image",
                    "images": [*records[0]["images"][:-1], f"{EP}/missing.png"]})
    annotation = tmp_path / "train.jsonl"
    annotation.write_text("".join(json.dumps(r) + "\n" for r in records))
    age(annotation)
    store = tmp_path / "store"
    first = build_stored_index(annotation, store, image_root=dataset)
    assert_same_index(first.index, build_index(annotation, image_root=dataset))
    assert first.index.report.by_reason(Reason.MISSING_IMAGE)
    picture = next((dataset / EP).glob("step_0001_*.png")).read_bytes()
    scramble_keeping_size_and_mtime(images(dataset))
    again = build_stored_index(annotation, store, image_root=dataset)
    assert again.reused and again.index == first.index
    (dataset / EP / "missing.png").write_bytes(picture)
    arrived = build_stored_index(annotation, store, image_root=dataset)
    assert not arrived.reused and arrived.checked == 1 and arrived.index.sample("needs-a-missing-image")


def test_a_damaged_stored_index_is_rebuilt(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    first = build_stored_index(dataset, tmp_path / "store")
    column = next(first.entry.glob("samples.key.*.npy"))
    column.write_bytes(column.read_bytes()[:20])
    again = build_stored_index(dataset, tmp_path / "store")
    assert not again.reused and "rebuilding it" in capsys.readouterr().err
    assert_same_index(again.index, first.index)
    assert build_stored_index(dataset, tmp_path / "store").reused


def test_a_store_that_cannot_be_written_still_gives_the_index(dataset: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.write_text("a file where the store's folder should be")
    stored = build_stored_index(dataset, store)
    assert not stored.saved and not stored.reused
    assert_same_index(stored.index, build_index(dataset))


def test_the_index_worker_checks_images_in_processes_of_its_own_and_says_why_it_failed(
    dataset: Path, tmp_path: Path
) -> None:
    """Precompute's rank 0 indexes in a worker process (its memory is gone when it exits), which
    starts image-check processes of its own; its errors reach the caller with their message."""
    from pipelines.index_worker import store_index_in_worker

    stored = store_index_in_worker([str(dataset)], tmp_path / "store", processes=2, prefill_min_files=1)
    assert not stored.reused
    assert [s.key for s in stored.load().samples] == [s.key for s in build_index(dataset).samples]
    again = store_index_in_worker([str(dataset)], tmp_path / "store", processes=2, prefill_min_files=1)
    assert again.reused and again.entry == stored.entry
    with pytest.raises(FileNotFoundError, match="does not exist"):
        store_index_in_worker([str(tmp_path / "nowhere")], tmp_path / "store")
