"""One contract, both cache formats: write, read back, resume, corrupt, several resolutions.

Every test runs against "zarr" and "wds" through the public interfaces only: the writer of
:func:`open_writer`, the manifest, and :func:`open_cache`'s reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.store_cases import (
    RESOLUTION,
    VARIANT,
    Content,
    assert_sample_equal,
    make_content,
    prepare,
    write_cache,
    write_cache_manifest,
    write_frame_shards,
    write_sample_shards,
)

from janus_cache.store import FORMATS, CacheOpenError, CacheSample, OpenedCache, open_cache
from janus_cache.store.commit import read_record
from janus_cache.store.layout import FRAMES_TABLE, SAMPLES_TABLE
OTHER = "pad56"


def all_samples(opened: OpenedCache) -> list[CacheSample]:
    """Every sample through the opened reader, as its format reads them (rows or a stream)."""
    reader = opened.reader
    if opened.streaming:
        return list(reader)
    return [reader[row] for row in range(len(reader))]


def file_states(root: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def content() -> Content:
    return make_content(resolutions={RESOLUTION: (28, 28), OTHER: (56, 42)})


def test_a_written_cache_reads_back_every_sample_exactly(fmt: str, content: Content, tmp_path: Path) -> None:
    writer = write_cache(fmt, tmp_path, content)
    write_cache_manifest(writer, content, [RESOLUTION])
    opened = open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name)
    assert (opened.format, opened.streaming) == (fmt, fmt == "wds")
    assert opened.layout.manifest.is_file() and opened.manifest.window == VARIANT
    samples = all_samples(opened)
    assert [s.row for s in samples] == list(range(content.n_samples)) == list(range(len(opened.reader)))
    for sample in samples:
        assert_sample_equal(sample, content, sample.row)
    assert all(check.ok for check in opened.reader.check())


def test_a_resume_skips_committed_shards_and_completes_the_cache(fmt: str, content: Content, tmp_path: Path) -> None:
    writer = prepare(fmt, tmp_path, content)
    n_frames, n_samples = len(writer.frame_shard_plan(RESOLUTION)), len(writer.sample_shard_plan(RESOLUTION))
    write_frame_shards(writer, content, RESOLUTION, list(range(n_frames)))
    write_sample_shards(writer, content, RESOLUTION, [0, 2])  # then "killed"
    before = file_states(tmp_path)

    resumed = prepare(fmt, tmp_path, content)  # the same layout again: kept, with its shards
    assert resumed.committed_sample_shards(RESOLUTION) == {0, 2}
    todo = [i for i in range(n_samples) if i not in resumed.committed_sample_shards(RESOLUTION)]
    write_sample_shards(resumed, content, RESOLUTION, todo)
    after = file_states(tmp_path)
    assert {p: after[p] for p in before} == before  # committed shards (and records) untouched
    write_cache_manifest(resumed, content, [RESOLUTION])
    for sample in all_samples(open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name)):
        assert_sample_equal(sample, content, sample.row)


def test_a_flipped_byte_in_a_sample_shard_fails_that_shards_check(fmt: str, content: Content, tmp_path: Path) -> None:
    writer = write_cache(fmt, tmp_path, content)
    write_cache_manifest(writer, content, [RESOLUTION])
    opened = open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name)
    plan = writer.sample_shard_plan(RESOLUTION)
    checks = opened.reader.check()
    target = next(c for c in checks if c.shard == 1 and c.array.endswith(f"{VARIANT.name}/{RESOLUTION}"))
    shard_file = opened.layout.path(read_record(tmp_path, target.array, 1).file)
    data = bytearray(shard_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard_file.write_bytes(bytes(data))

    problems = [c for c in opened.reader.check() if not c.ok]
    assert [(p.array, p.shard) for p in problems] == [(target.array, 1)]
    assert "fails its checksum" in problems[0].problem
    assert writer.committed_sample_shards(RESOLUTION) == set(range(len(plan))) - {1}


def test_a_cache_holds_several_resolutions_and_reads_exactly_the_asked_one(fmt: str, content: Content,
                                                                            tmp_path: Path) -> None:
    write_cache(fmt, tmp_path, content, RESOLUTION)
    writer = write_cache(fmt, tmp_path, content, OTHER)  # precompute again at another resolution
    write_cache_manifest(writer, content, [RESOLUTION, OTHER])
    for name in (RESOLUTION, OTHER):
        opened = open_cache(tmp_path, resolution=name, variant=VARIANT.name)
        assert opened.resolution == name
        samples = all_samples(opened)
        assert len(samples) == content.n_samples
        for sample in samples:
            assert_sample_equal(sample, content, sample.row, name)


def test_a_cache_opened_whole_reads_any_resolution_and_its_tables_once(fmt: str, content: Content,
                                                                       tmp_path: Path) -> None:
    """verify opens a cache whole (``open_cache(path)``): the same manifest and samples as a cache
    opened for one resolution, a reader of each resolution on request, its key columns read once;
    with ``check_metadata=False`` a damaged metadata file is left to the integrity check to name."""
    write_cache(fmt, tmp_path, content, RESOLUTION)
    writer = write_cache(fmt, tmp_path, content, OTHER)
    write_cache_manifest(writer, content, [RESOLUTION, OTHER])
    whole = open_cache(tmp_path)
    assert (whole.resolution, whole.variant, whole.format) == (None, VARIANT.name, fmt)
    assert whole.manifest == open_cache(tmp_path, resolution=OTHER, variant=VARIANT.name).manifest
    with pytest.raises(CacheOpenError, match="opened whole"):
        whole.reader  # noqa: B018 - the property is what is tested
    for name in (RESOLUTION, OTHER):
        reader = whole.reader_at(name)
        samples = list(reader) if whole.streaming else [reader[row] for row in range(len(reader))]
        assert [s.row for s in samples] == list(range(content.n_samples))
        for sample in samples:
            assert_sample_equal(sample, content, sample.row, name)
    keys = whole.keys(SAMPLES_TABLE)
    assert keys == content.sample_keys and whole.keys(SAMPLES_TABLE) is keys
    assert whole.name_of(FRAMES_TABLE, 1) == content.frame_keys[1] and whole.name_of(FRAMES_TABLE, -1) == "row -1"
    assert whole.table(SAMPLES_TABLE)["instruction"] == content.instructions
    with pytest.raises(ValueError, match="name both, or neither"):
        open_cache(tmp_path, resolution=RESOLUTION)

    edited = whole.layout.manifest
    edited.write_text(edited.read_text().replace('"schema_version"', '"schema_version" ', 1))
    with pytest.raises(CacheOpenError, match="manifest.json"):
        open_cache(tmp_path)
    assert open_cache(tmp_path, check_metadata=False).manifest == whole.manifest


def test_a_missing_resolution_or_variant_is_one_line_naming_what_the_cache_holds(fmt: str, content: Content,
                                                                                  tmp_path: Path) -> None:
    write_cache(fmt, tmp_path, content, RESOLUTION)
    writer = write_cache(fmt, tmp_path, content, OTHER)
    write_cache_manifest(writer, content, [RESOLUTION, OTHER])
    manifest = tmp_path / "manifest.json"
    with pytest.raises(CacheOpenError) as err:
        open_cache(tmp_path, resolution="pad644", variant=VARIANT.name)
    assert str(err.value) == (f"{manifest}: the cache holds resolution(s) {RESOLUTION}, {OTHER}, not pad644 "
                              "(precompute with --resolution pad644 adds it)")
    with pytest.raises(CacheOpenError, match=rf"^{manifest}: the cache holds window variant {VARIANT.name}, not h8_"):
        open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name.replace("h3_", "h8_"))
    with pytest.raises(CacheOpenError, match=r"is not a janus cache \(no manifest.json\)$"):
        open_cache(tmp_path / "nothing", resolution=RESOLUTION, variant=VARIANT.name)
