"""webdataset cache store, what only it does: the same records as zarr, windows assembled from the
frames array, streaming shards and workers, tar members and keys, the incomplete-cache refusal,
refused writes, compression. The contract both formats share is
tests/unit/test_store_conformance.py."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.store_cases import (
    RESOLUTION,
    SAMPLES_PER_SHARD,
    VARIANT,
    assert_sample_equal,
    bits,
    make_content,
    prepare,
    write_cache,
    write_frame_shards,
    write_sample_shards,
)

from janus_cache.store import (
    CacheLayout,
    CacheWriter,
    StoreError,
    WdsCacheReader,
    ZarrCacheReader,
)
from janus_cache.store.layout import wds_samples
from janus_cache.store.wds_store import decode_key, encode_key

SHARDS = wds_samples(VARIANT.name, RESOLUTION)


def shard_path(root: Path, shard: int) -> Path:
    return CacheLayout(root).wds_shard(VARIANT.name, RESOLUTION, shard)


# -- round trips ---------------------------------------------------------------------------------


def test_wds_and_zarr_readers_yield_the_same_sample_records(tmp_path: Path) -> None:
    content = make_content()
    write_cache("wds", tmp_path / "wds", content)
    write_cache("zarr", tmp_path / "zarr", content)
    zarr_reader = ZarrCacheReader(tmp_path / "zarr", RESOLUTION, VARIANT.name)
    for streamed in WdsCacheReader(tmp_path / "wds", RESOLUTION, VARIANT.name):
        indexed = zarr_reader[streamed.row]
        assert type(streamed) is type(indexed)
        assert (streamed.key, streamed.row, streamed.meta) == (indexed.key, indexed.row, indexed.meta)
        assert np.array_equal(streamed.frames, indexed.frames)
        assert torch.equal(bits(streamed.feature), bits(indexed.feature))


def test_windows_read_from_the_frames_array_give_the_same_tar_bytes_as_passed_windows(tmp_path: Path) -> None:
    content = make_content()
    passed = write_cache("wds", tmp_path / "passed", content)
    read = prepare("wds", tmp_path / "read", content)
    write_frame_shards(read, content, RESOLUTION, list(range(len(read.frame_shard_plan(RESOLUTION)))))
    write_sample_shards(read, content, RESOLUTION, list(range(len(read.sample_shard_plan(RESOLUTION)))), pass_windows=False)
    assert read.shard_table() == passed.shard_table()


def test_a_subset_of_shards_streams_only_their_rows(tmp_path: Path) -> None:
    content = make_content()
    write_cache("wds", tmp_path, content)
    rows = [s.row for s in WdsCacheReader(tmp_path, RESOLUTION, VARIANT.name).shard(1)]
    assert rows == list(range(SAMPLES_PER_SHARD, 2 * SAMPLES_PER_SHARD))


def test_dataloader_workers_split_the_shards_and_stream_every_sample_once(tmp_path: Path) -> None:
    content = make_content()
    write_cache("wds", tmp_path, content)
    loader = torch.utils.data.DataLoader(WdsCacheReader(tmp_path, RESOLUTION, VARIANT.name).dataset(), batch_size=None, num_workers=2)
    samples = sorted(loader, key=lambda s: s.row)
    assert [s.row for s in samples] == list(range(content.n_samples))
    for sample in samples:
        assert_sample_equal(sample, content, sample.row)


# -- tar members and keys ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ep00/step.3", "a.b.c/d", "100%/x y", "ü/北.5", "plain_key-1~"])
def test_key_encoding_is_reversible_and_leaves_no_dot_or_slash(key: str) -> None:
    encoded = encode_key(key)
    assert "." not in encoded and "/" not in encoded
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-~%")
    assert decode_key(encoded) == key


def test_a_shard_is_a_plain_tar_of_three_members_per_sample_keyed_by_the_encoded_sample_key(tmp_path: Path) -> None:
    content = make_content()
    write_cache("wds", tmp_path, content)
    with tarfile.open(shard_path(tmp_path, 0)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    expected = [
        f"{encode_key(content.sample_keys[row])}.{ext}"
        for row in range(SAMPLES_PER_SHARD)
        for ext in ("feature.blosc", "frames.blosc", "json")
    ]
    assert names == expected
    assert {(m.mtime, m.uname, m.mode) for m in members} == {(0, "janus", 0o444)}


# -- commit semantics ----------------------------------------------------------------------------


def test_an_uncommitted_shard_is_not_listed_and_the_reader_names_it(tmp_path: Path) -> None:
    content = make_content()
    writer = prepare("wds", tmp_path, content)
    assert isinstance(writer, CacheWriter)
    write_frame_shards(writer, content, RESOLUTION, list(range(len(writer.frame_shard_plan(RESOLUTION)))))
    write_sample_shards(writer, content, RESOLUTION, [0, 2])
    assert writer.committed_sample_shards(RESOLUTION) == {0, 2}
    with pytest.raises(StoreError, match=rf"{SHARDS}#1: shard {SHARDS}#1 is not committed"):
        WdsCacheReader(tmp_path, RESOLUTION, VARIANT.name).shard_paths()


def test_refuses_features_or_windows_of_the_wrong_shape(tmp_path: Path) -> None:
    content = make_content()
    writer = prepare("wds", tmp_path, content)
    features = content.features[RESOLUTION][:SAMPLES_PER_SHARD]
    with pytest.raises(StoreError, match=rf"{SHARDS}#0 needs features \(3, 4, 8\)"):
        writer.write_samples_shard(RESOLUTION, 0, features[:2])
    with pytest.raises(StoreError, match=rf"{SHARDS}#0 needs uint8 window frames \(3, 4, 28, 28, 3\)"):
        writer.write_samples_shard(RESOLUTION, 0, features, np.zeros((3, 4, 28, 28, 3), dtype=np.float32))
    assert writer.committed_sample_shards(RESOLUTION) == set()


# -- compression ---------------------------------------------------------------------------------


def test_samples_are_stored_compressed(tmp_path: Path) -> None:
    content = make_content(resolutions={"pad112": (112, 112)}, feature_shape=(64, 64))
    write_cache("wds", tmp_path, content, "pad112")
    raw = sum(
        content.frames["pad112"][content.window_rows[row]].nbytes + content.features["pad112"][row].numel() * 2
        for row in range(content.n_samples)
    )
    stored = sum(p.stat().st_size for p in CacheLayout(tmp_path).wds_samples(VARIANT.name, "pad112").glob("*.tar"))
    assert stored < raw / 2
