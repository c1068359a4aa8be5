"""One contract every cache format passes: write, read back, resume, grow, damage, several resolutions.

:class:`StoreConformance` holds the format-independent contract of a cache store as tests (the
pattern of zarr-python's ``zarr.testing.store.StoreTests``): every test goes through the public
interfaces only (the writer of :func:`open_writer`, the manifest, :func:`open_cache` and its
reader), and each format subclasses it once, saying only what differs: its name and where its
sample shards and stored frames lie on disk (what a test damages, bypassing the store as
``StoreTests.get``/``set`` do). A format in :data:`janus_cache.store.formats.CACHE_FORMATS` without
a subclass here fails :func:`test_every_registered_format_has_a_conformance_class`.

Each class writes one complete cache (two resolutions, a manifest) once; tests that only read use
it as is, tests that damage or rewrite work on a copy of it.
"""

from __future__ import annotations

import re
import shutil
import tarfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from helpers.store_cases import (
    FRAMES_PER_SHARD,
    RESOLUTION,
    SAMPLES_PER_SHARD,
    VARIANT,
    Content,
    assert_sample_equal,
    first_episodes,
    make_content,
    prepare,
    write_cache,
    write_cache_manifest,
    write_frame_shards,
    write_sample_shards,
    write_with_two_processes,
)

import janus_cache.store.commit as commit_module
from janus_cache.store import (
    CacheOpenError,
    CacheSample,
    CacheWriter,
    DamagedData,
    Manifest,
    OpenedCache,
    ShardEntry,
    StoreError,
    open_cache,
    open_writer,
    read_manifest,
    verify_shard,
)
from janus_cache.store.commit import read_record
from janus_cache.store.formats import CACHE_FORMATS, cache_format
from janus_cache.store.layout import FRAMES_TABLE, SAMPLES_TABLE, features_array, frames_array, wds_samples

OTHER = "pad56"
FRAMES, SAMPLES = "frames", "samples"
"""The two kinds of shard a cache writes: frame rows (the zarr group both formats share) and sample
rows (the format's own storage)."""


def all_samples(opened: OpenedCache) -> list[CacheSample]:
    """Every sample through the opened reader, as its format reads them (rows or a stream)."""
    reader = opened.reader
    if opened.streaming:
        return list(reader)
    return [reader[row] for row in range(len(reader))]


def file_states(root: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def flip_a_byte(file: Path, offset: int | None = None) -> None:
    """Flip one bit of the byte at ``offset`` (the middle of the file by default), on disk."""
    data = bytearray(file.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    file.write_bytes(bytes(data))


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-10])


def delete(file: Path) -> None:
    file.unlink()


def killed_while_committing(path: Path, data: bytes) -> None:
    raise KeyboardInterrupt("killed while writing the commit record")


@dataclass(frozen=True)
class Written:
    """A complete cache written once per class: RESOLUTION then OTHER, and its manifest."""

    root: Path
    manifest: Manifest
    shard_table: dict[str, tuple[ShardEntry, ...]]
    before_other: dict[Path, tuple[int, bytes]]
    """Every file (mtime, bytes) once RESOLUTION was written, before OTHER was added."""
    after_other: dict[Path, tuple[int, bytes]]


@pytest.fixture(scope="module")
def content() -> Content:
    return make_content(resolutions={RESOLUTION: (28, 28), OTHER: (56, 42)})


class StoreConformance(ABC):
    """The contract of a cache store; subclassed once per format (``Test<Format>Store``), not
    collected itself (no ``Test`` prefix)."""

    format: ClassVar[str]

    # -- what differs per format: where its data lies on disk ------------------------------------

    @abstractmethod
    def samples_array(self, resolution: str) -> str:
        """The array (commit records' name) of the per-sample shards of ``resolution``."""

    @abstractmethod
    def sample_shard_file(self, root: Path, shard: int) -> Path:
        """The file sample shard ``shard`` of RESOLUTION is stored in."""

    @abstractmethod
    def stored_frame_byte(self, root: Path) -> tuple[Path, int]:
        """A file and an offset in it holding a byte of a frame that reading the samples decodes."""

    # -- shared by every format -----------------------------------------------------------------

    @staticmethod
    def frame_shard_file(root: Path, shard: int) -> Path:
        """Frames are the zarr group's array in every format: one file per shard of frame rows."""
        return root / frames_array(RESOLUTION) / "c" / str(shard) / "0" / "0" / "0"

    def shard_file(self, root: Path, kind: str, shard: int) -> Path:
        return self.frame_shard_file(root, shard) if kind == FRAMES else self.sample_shard_file(root, shard)

    def array(self, kind: str) -> str:
        return frames_array(RESOLUTION) if kind == FRAMES else self.samples_array(RESOLUTION)

    @staticmethod
    def committed(writer: CacheWriter, kind: str, verify: bool = True) -> set[int]:
        if kind == FRAMES:
            return writer.committed_frame_shards(RESOLUTION, verify)
        return writer.committed_sample_shards(RESOLUTION, verify)

    @pytest.fixture(scope="class")
    @classmethod
    def written(cls, content: Content, tmp_path_factory: pytest.TempPathFactory) -> Written:
        root = tmp_path_factory.mktemp(f"{cls.format}-cache")
        write_cache(cls.format, root, content, RESOLUTION)
        before_other = file_states(root)
        writer = write_cache(cls.format, root, content, OTHER)  # precompute again at another resolution
        after_other = file_states(root)
        manifest = write_cache_manifest(writer, content, [RESOLUTION, OTHER])
        return Written(root, manifest, writer.shard_table(), before_other, after_other)

    @pytest.fixture
    def cache_copy(self, written: Written, tmp_path: Path) -> Path:
        """A copy of the class's cache, for a test that damages or rewrites it."""
        return Path(shutil.copytree(written.root, tmp_path / "cache"))

    def opened(self, root: Path, resolution: str = RESOLUTION) -> OpenedCache:
        return open_cache(root, resolution=resolution, variant=VARIANT.name)

    # -- writing and reading back ---------------------------------------------------------------

    def test_every_sample_reads_back_exactly(self, written: Written, content: Content) -> None:
        opened = self.opened(written.root)
        assert (opened.format, opened.streaming) == (self.format, cache_format(self.format).streaming)
        assert opened.layout.manifest.is_file() and opened.manifest.window == VARIANT
        samples = all_samples(opened)
        assert [s.row for s in samples] == list(range(content.n_samples)) == list(range(len(opened.reader)))
        for sample in samples:
            assert_sample_equal(sample, content, sample.row)
        assert all(check.ok for check in opened.reader.check())

    def test_float32_features_round_trip_exactly(self, tmp_path: Path) -> None:
        content = make_content(feature_dtype="float32")
        write_cache_manifest(write_cache(self.format, tmp_path, content), content, [RESOLUTION])
        samples = all_samples(self.opened(tmp_path))
        assert len(samples) == content.n_samples
        for sample in samples:
            assert_sample_equal(sample, content, sample.row)  # float32, bit for bit

    def test_the_manifest_keys_and_tables_read_back_as_written(self, written: Written, content: Content) -> None:
        """open_cache finds the format in the manifest; the manifest, the key columns and the
        tables read back as written, and a writer opened again sees the shards the manifest lists."""
        opened = open_cache(written.root)
        assert opened.format == self.format == opened.manifest.format
        assert opened.manifest == written.manifest == read_manifest(written.root)
        assert open_writer(self.format, written.root, VARIANT.name).shard_table() == opened.manifest.shards
        assert opened.keys(FRAMES_TABLE) == content.frame_keys
        assert opened.keys(SAMPLES_TABLE) == content.sample_keys
        samples = opened.table(SAMPLES_TABLE)
        assert samples["window_rows"].tolist() == content.window_rows.tolist()
        assert samples["action"].tolist() == content.actions.tolist()
        assert samples["instruction"] == content.instructions

    def test_a_cache_holds_several_resolutions_and_reads_exactly_the_asked_one(self, written: Written,
                                                                                content: Content) -> None:
        for name in (RESOLUTION, OTHER):
            opened = self.opened(written.root, name)
            assert opened.resolution == name
            samples = all_samples(opened)
            assert len(samples) == content.n_samples
            for sample in samples:
                assert_sample_equal(sample, content, sample.row, name)

    def test_adding_a_resolution_leaves_every_earlier_file_untouched(self, written: Written) -> None:
        assert set(written.after_other) > set(written.before_other)
        assert {p: written.after_other[p] for p in written.before_other} == written.before_other  # tables too

    def test_a_cache_opened_whole_reads_any_resolution_and_its_tables_once(self, cache_copy: Path,
                                                                           content: Content) -> None:
        """verify opens a cache whole (``open_cache(path)``): the same manifest and samples as a cache
        opened for one resolution, a reader of each resolution on request, its key columns read once;
        with ``check_metadata=False`` a damaged metadata file is left to the integrity check to name."""
        whole = open_cache(cache_copy)
        assert (whole.resolution, whole.variant, whole.format) == (None, VARIANT.name, self.format)
        assert whole.manifest == self.opened(cache_copy, OTHER).manifest
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
            open_cache(cache_copy, resolution=RESOLUTION)

        edited = whole.layout.manifest
        edited.write_text(edited.read_text().replace('"schema_version"', '"schema_version" ', 1))
        with pytest.raises(CacheOpenError, match="manifest.json"):
            open_cache(cache_copy)
        assert open_cache(cache_copy, check_metadata=False).manifest == whole.manifest

    def test_a_missing_resolution_or_variant_is_one_line_naming_what_the_cache_holds(self, written: Written) -> None:
        manifest = written.root / "manifest.json"
        with pytest.raises(CacheOpenError) as err:
            self.opened(written.root, "pad644")
        assert str(err.value) == (f"{manifest}: the cache holds resolution(s) {RESOLUTION}, {OTHER}, not pad644 "
                                  "(precompute with --resolution pad644 adds it)")
        with pytest.raises(CacheOpenError, match=rf"^{manifest}: the cache holds window variant {VARIANT.name}, not h8_"):
            open_cache(written.root, resolution=RESOLUTION, variant=VARIANT.name.replace("h3_", "h8_"))
        with pytest.raises(CacheOpenError, match=r"is not a janus cache \(no manifest.json\)$"):
            self.opened(written.root / "nothing")

    def test_equal_content_gives_byte_identical_shards(self, written: Written, content: Content,
                                                       tmp_path: Path) -> None:
        again = write_cache(self.format, tmp_path, content).shard_table()  # RESOLUTION only
        assert set(written.shard_table) - set(again) == {frames_array(OTHER), self.samples_array(OTHER)}
        assert {array: written.shard_table[array] for array in again} == again
        assert self.samples_array(RESOLUTION) in again
        assert all(entry.committed for entries in again.values() for entry in entries)

    def test_two_processes_writing_different_shards_give_the_same_valid_cache(self, written: Written,
                                                                              content: Content,
                                                                              tmp_path: Path) -> None:
        writer = prepare(self.format, tmp_path, content)
        write_with_two_processes(writer, seed=0)  # the content of `content` at RESOLUTION
        assert all(check.ok for check in writer.audit())
        assert writer.shard_table() == {array: written.shard_table[array] for array in writer.shard_table()}
        write_cache_manifest(writer, content, [RESOLUTION])
        for sample in all_samples(self.opened(tmp_path)):
            assert_sample_equal(sample, content, sample.row)

    # -- commits, resume and growth -------------------------------------------------------------

    def test_unwritten_shards_and_partial_files_are_invisible_after_reopen(self, content: Content,
                                                                          tmp_path: Path) -> None:
        writer = prepare(self.format, tmp_path, content)
        write_frame_shards(writer, content, RESOLUTION, list(range(len(writer.frame_shard_plan(RESOLUTION)))))
        written = [i for i in range(len(writer.sample_shard_plan(RESOLUTION))) if i != 1]
        write_sample_shards(writer, content, RESOLUTION, written)  # and "killed" while writing shard 1
        file = self.sample_shard_file(tmp_path, 1)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.with_name(f"{file.name}.123.deadbeef.partial").write_bytes(b"half a shard")

        reopened = open_writer(self.format, tmp_path, VARIANT.name)
        assert reopened.committed_sample_shards(RESOLUTION) == set(written)
        problems = [c for c in reopened.audit() if not c.ok]
        assert [(c.array, c.shard) for c in problems] == [(self.samples_array(RESOLUTION), 1)]
        assert "not committed" in problems[0].problem
        write_cache_manifest(reopened, content, [RESOLUTION])
        with pytest.raises(StoreError, match=re.escape(self.samples_array(RESOLUTION))):
            all_samples(self.opened(tmp_path))

    def test_a_resume_skips_committed_shards_and_completes_the_cache(self, content: Content, tmp_path: Path) -> None:
        writer = prepare(self.format, tmp_path, content)
        n_frames, n_samples = len(writer.frame_shard_plan(RESOLUTION)), len(writer.sample_shard_plan(RESOLUTION))
        write_frame_shards(writer, content, RESOLUTION, list(range(n_frames)))
        write_sample_shards(writer, content, RESOLUTION, [0, 2])  # then "killed"
        before = file_states(tmp_path)

        resumed = prepare(self.format, tmp_path, content)  # the same layout again: kept, with its shards
        assert resumed.committed_sample_shards(RESOLUTION) == {0, 2}
        todo = [i for i in range(n_samples) if i not in resumed.committed_sample_shards(RESOLUTION)]
        write_sample_shards(resumed, content, RESOLUTION, todo)
        after = file_states(tmp_path)
        assert {p: after[p] for p in before} == before  # committed shards (and records) untouched
        write_cache_manifest(resumed, content, [RESOLUTION])
        for sample in all_samples(self.opened(tmp_path)):
            assert_sample_equal(sample, content, sample.row)

    @pytest.mark.parametrize("kind", [FRAMES, SAMPLES])
    def test_a_corrupt_shard_killed_while_rewritten_stays_uncommitted_and_a_rewrite_restores_it(
        self, kind: str, cache_copy: Path, content: Content, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A shard fails its check, leftovers of an interrupted write lie next to it, and the rewrite
        is killed after the shard file but before its commit record: the shard stays uncommitted
        (its old record went first) and the leftovers are gone; rewriting it again commits the same
        bytes as the first build, and every sample reads back exactly."""
        writer = open_writer(self.format, cache_copy, VARIANT.name)
        write = write_frame_shards if kind == FRAMES else write_sample_shards
        file, array = self.shard_file(cache_copy, kind, 1), self.array(kind)
        original = read_record(cache_copy, array, 1)
        assert original is not None and cache_copy / original.file == file
        flip_a_byte(file)
        leftover = file.with_name(f"{file.name}.123.deadbeef.partial")
        leftover.write_bytes(b"half a shard")
        assert 1 not in self.committed(writer, kind)

        with monkeypatch.context() as patch:
            patch.setattr(commit_module, "atomic_write_bytes", killed_while_committing)
            with pytest.raises(KeyboardInterrupt):
                write(writer, content, RESOLUTION, [1])
        assert file.is_file() and not leftover.exists()
        assert read_record(cache_copy, array, 1) is None and 1 not in self.committed(writer, kind, verify=False)

        write(writer, content, RESOLUTION, [1])
        plan = writer.frame_shard_plan(RESOLUTION) if kind == FRAMES else writer.sample_shard_plan(RESOLUTION)
        assert self.committed(writer, kind) == set(range(len(plan)))
        assert read_record(cache_copy, array, 1) == original
        for sample in all_samples(self.opened(cache_copy)):
            assert_sample_equal(sample, content, sample.row)

    def test_a_cache_grown_by_more_episodes_keeps_its_full_shards_and_reads_back_whole(
        self, content: Content, tmp_path: Path
    ) -> None:
        """Appending episodes (``grow``): the full shards of the smaller cache stay as written, its
        partly filled last shards are uncommitted and rewritten, and the grown cache reads back whole."""
        small = first_episodes(content, 1)
        assert len(small.frame_keys) % FRAMES_PER_SHARD and small.n_samples % SAMPLES_PER_SHARD  # partial last shards
        write_cache(self.format, tmp_path, small)
        full_frames = set(range(len(small.frame_keys) // FRAMES_PER_SHARD))
        full_samples = set(range(small.n_samples // SAMPLES_PER_SHARD))
        kept = [self.frame_shard_file(tmp_path, i) for i in full_frames]
        kept += [self.sample_shard_file(tmp_path, i) for i in full_samples]
        before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept}

        writer = prepare(self.format, tmp_path, content, grow=True)
        assert writer.committed_frame_shards(RESOLUTION) == full_frames
        assert writer.committed_sample_shards(RESOLUTION) == full_samples
        n_frames, n_samples = len(writer.frame_shard_plan(RESOLUTION)), len(writer.sample_shard_plan(RESOLUTION))
        write_frame_shards(writer, content, RESOLUTION, sorted(set(range(n_frames)) - full_frames))
        write_sample_shards(writer, content, RESOLUTION, sorted(set(range(n_samples)) - full_samples))
        assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept} == before
        assert all(check.ok for check in writer.audit())
        write_cache_manifest(writer, content, [RESOLUTION])
        samples = all_samples(self.opened(tmp_path))
        assert [s.row for s in samples] == list(range(content.n_samples))
        for sample in samples:
            assert_sample_equal(sample, content, sample.row)

    # -- damage ---------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("damage", "words"),
        [(flip_a_byte, "checksum"), (truncate, "truncated"), (delete, "missing")],
        ids=["flipped-byte", "truncated", "missing-file"],
    )
    def test_a_damaged_shard_fails_verification_naming_the_shard(
        self, cache_copy: Path, damage: Callable[[Path], None], words: str
    ) -> None:
        """Damage to a frame shard and a sample shard: each fails verification naming the shard and
        its file, the audit lists exactly those two, and neither counts as committed once checked
        (its commit record still stands unchecked)."""
        writer = open_writer(self.format, cache_copy, VARIANT.name)
        damaged = [(FRAMES, 1), (SAMPLES, 2)]
        records = {kind: read_record(cache_copy, self.array(kind), shard) for kind, shard in damaged}
        for kind, shard in damaged:
            record = records[kind]
            assert record is not None and verify_shard(cache_copy, record).ok
            damage(self.shard_file(cache_copy, kind, shard))
        for kind, shard in damaged:
            check = verify_shard(cache_copy, records[kind])
            assert not check.ok
            assert f"{self.array(kind)}#{shard}" in check.problem and words in check.problem
            assert records[kind].file in check.problem
            assert shard not in self.committed(writer, kind) and shard in self.committed(writer, kind, verify=False)
        assert [(c.array, c.shard) for c in writer.audit() if not c.ok] == [
            (self.array(kind), shard) for kind, shard in damaged]

    def test_a_flipped_byte_in_a_sample_shard_fails_that_shards_check(self, cache_copy: Path) -> None:
        writer = open_writer(self.format, cache_copy, VARIANT.name)
        opened = self.opened(cache_copy)
        plan = writer.sample_shard_plan(RESOLUTION)
        checks = opened.reader.check()
        target = next(c for c in checks if c.shard == 1 and c.array.endswith(f"{VARIANT.name}/{RESOLUTION}"))
        flip_a_byte(opened.layout.path(read_record(cache_copy, target.array, 1).file))

        problems = [c for c in opened.reader.check() if not c.ok]
        assert [(p.array, p.shard) for p in problems] == [(target.array, 1)]
        assert "fails its checksum" in problems[0].problem
        assert writer.committed_sample_shards(RESOLUTION) == set(range(len(plan))) - {1}

    def test_a_flipped_byte_in_stored_frames_is_damaged_data_naming_the_file_and_sample(
        self, cache_copy: Path, content: Content
    ) -> None:
        """Reading never hands out damaged bytes: the sample whose frames hold the flipped byte is a
        one-line DamagedData naming the file and the sample."""
        file, offset = self.stored_frame_byte(cache_copy)
        flip_a_byte(file, offset)
        with pytest.raises(DamagedData) as err:
            all_samples(self.opened(cache_copy))
        assert err.value.file == str(file) and str(file) in str(err.value)
        assert err.value.key in content.sample_keys and err.value.key in str(err.value)
        assert "\n" not in str(err.value)


class TestZarrStore(StoreConformance):
    format = "zarr"

    def samples_array(self, resolution: str) -> str:
        return features_array(VARIANT.name, resolution)

    def sample_shard_file(self, root: Path, shard: int) -> Path:
        return root / self.samples_array(RESOLUTION) / "c" / str(shard) / "0" / "0"

    def stored_frame_byte(self, root: Path) -> tuple[Path, int]:
        """Frame shard 1's first chunk (its index is at the end of the file)."""
        return self.frame_shard_file(root, 1), 7


class TestWdsStore(StoreConformance):
    format = "wds"

    def samples_array(self, resolution: str) -> str:
        return wds_samples(VARIANT.name, resolution)

    def sample_shard_file(self, root: Path, shard: int) -> Path:
        return root / self.samples_array(RESOLUTION) / f"shard-{shard:06d}.tar"

    def stored_frame_byte(self, root: Path) -> tuple[Path, int]:
        """The window frames of tar shard 1's first sample (its ``frames.blosc`` member's data)."""
        file = self.sample_shard_file(root, 1)
        with tarfile.open(file) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(".frames.blosc"))
        return file, member.offset_data + member.size // 2


def test_every_registered_format_has_a_conformance_class() -> None:
    classes = {cls.format: cls for cls in StoreConformance.__subclasses__()}
    missing = sorted({f.name for f in CACHE_FORMATS} - set(classes))
    assert not missing, f"cache format(s) {missing} have no StoreConformance subclass in this module"
    assert sorted(classes) == sorted(f.name for f in CACHE_FORMATS)
    for cls in classes.values():
        assert cls.__name__.startswith("Test") and globals()[cls.__name__] is cls  # collected here
