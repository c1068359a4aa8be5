"""Nothing damaged is ever read back: every chunk, tar member and metadata file is checked.

Real caches on disk (both formats, written by the store's writers), damaged the way a disk or a
user damages them: one flipped byte in a frames shard, a features shard, the ``window_rows``
table, a text table, a tar member or a tar header; a deleted shard file; an edited ``"endian"``.
Each read is a one-line :class:`DamagedData` naming the file (and the sample), never a wrong
value, a fill value or a codec traceback. The trainer's side (stop or skip) is
``test_damage_training.py``.
"""

from __future__ import annotations

import json
import pickle
import tarfile
from pathlib import Path

import pytest
import torch

from helpers.store_cases import (
    FRAMES_PER_SHARD,
    RESOLUTION,
    SAMPLES_PER_SHARD,
    VARIANT,
    assert_sample_equal,
    make_content,
    write_cache,
    write_cache_manifest,
    write_frame_shards,
    write_sample_shards,
)
from janus_cache.store import (
    CacheLayout,
    CacheOpenError,
    DamagedData,
    MissingChunk,
    WdsCacheReader,
    ZarrCacheReader,
    open_cache,
    open_writer,
)
from janus_cache.store.layout import features_array, frames_array, table_column
from janus_cache.store.wds_store import FRAMES_MEMBER, encode_key

FRAMES = frames_array(RESOLUTION)
FEATURES = features_array(VARIANT.name, RESOLUTION)


def flip_byte(path: Path, offset: int) -> None:
    """Flip the lowest bit of the byte at ``offset`` (negative: from the end)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def zarr_cache(root: Path):
    content = make_content()
    writer = write_cache("zarr", root, content)
    write_cache_manifest(writer, content, [RESOLUTION])
    return content, ZarrCacheReader(root, RESOLUTION, VARIANT.name)


def rows_using_frame(content, frame_row: int) -> list[int]:
    return [r for r in range(content.n_samples) if frame_row in content.window_rows[r].tolist()]


# -- zarr ------------------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_frames_shard_names_the_shard_file_and_the_sample(tmp_path: Path) -> None:
    content, reader = zarr_cache(tmp_path)
    shard_file = reader.shard_file(FRAMES, 1)  # frames 4..7; byte 20 lies in frame 4's chunk
    flip_byte(shard_file, 20)
    damaged = rows_using_frame(content, 4)
    for row in damaged:
        with pytest.raises(DamagedData) as caught:
            reader.sample(row)
        err = caught.value
        assert err.file == str(shard_file) and err.key == content.sample_keys[row]
        assert "checksum mismatch (crc32c)" in str(err) and "\n" not in str(err)
        assert str(shard_file) in str(err) and content.sample_keys[row] in str(err)
    intact = next(r for r in range(content.n_samples) if not set(content.window_rows[r].tolist()) & set(range(4, 8)))
    assert_sample_equal(reader.sample(intact), content, intact)


def test_a_flipped_byte_in_a_shard_index_is_damage_too(tmp_path: Path) -> None:
    content, reader = zarr_cache(tmp_path)
    shard_file = reader.shard_file(FEATURES, 0)
    flip_byte(shard_file, -6)  # the shard index at the file's end (its crc32c is the last 4 bytes)
    with pytest.raises(DamagedData, match="checksum mismatch") as caught:
        reader.sample(0)
    assert caught.value.file == str(shard_file)


def test_a_flipped_byte_in_a_features_shard_names_the_shard_file_and_the_sample(tmp_path: Path) -> None:
    content, reader = zarr_cache(tmp_path)
    shard_file = reader.shard_file(FEATURES, 1)  # samples 3..5; byte 20 lies in sample 3's chunk
    flip_byte(shard_file, 20)
    with pytest.raises(DamagedData) as caught:
        reader.sample(3)
    assert (caught.value.file, caught.value.key) == (str(shard_file), content.sample_keys[3])
    for row in (2, 4, 5):
        assert_sample_equal(reader.sample(row), content, row)


def test_a_flipped_byte_in_the_window_rows_table_is_never_read_as_other_frames(tmp_path: Path) -> None:
    content, reader = zarr_cache(tmp_path)
    table_file = reader.shard_file(table_column("samples", "window_rows"), 0)
    flip_byte(table_file, 30)
    with pytest.raises(DamagedData) as caught:
        reader.sample(5)
    assert caught.value.file == str(table_file) and "\n" not in str(caught.value)


def test_a_flipped_byte_in_a_text_table_is_one_line_naming_the_file_not_a_codec_traceback(tmp_path: Path) -> None:
    content, reader = zarr_cache(tmp_path)
    text_file = reader.shard_file(table_column("samples", "instruction", "utf8"), 0)
    flip_byte(text_file, 40)
    with pytest.raises(DamagedData) as caught:
        reader.sample(0)
    message = str(caught.value)
    assert caught.value.file == str(text_file) and caught.value.key == "row 0"
    assert message.startswith("damaged cache data: ") and "\n" not in message and "blosc" not in message.lower()


def test_a_deleted_shard_file_is_an_error_never_zarrs_fill_value(tmp_path: Path) -> None:
    content, reader = zarr_cache(tmp_path)
    shard_file = reader.shard_file(FEATURES, 2)
    shard_file.unlink()
    with pytest.raises(MissingChunk) as caught:
        reader.sample(7)
    assert caught.value.file == str(shard_file) and caught.value.key == content.sample_keys[7]
    assert "file missing" in str(caught.value)


def test_damage_survives_pickling_as_the_same_one_line_error(tmp_path: Path) -> None:
    """What a DataLoader worker sends to the main process is the same error, fields and all."""
    err = MissingChunk(tmp_path / "frames/pad28/c/1/0/0/0", key="ep00/step.3")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is MissingChunk and str(again) == str(err)
    assert (again.file, again.key, again.samples) == (err.file, err.key, err.samples)


def test_an_edited_endian_in_a_zarr_json_refuses_to_open_naming_the_file(tmp_path: Path) -> None:
    content, _ = zarr_cache(tmp_path)
    open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name)  # intact: opens
    meta = tmp_path / FEATURES / "zarr.json"
    meta.write_text(meta.read_text().replace('"little"', '"big"'))
    with pytest.raises(CacheOpenError) as caught:
        open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name)
    assert str(meta) in str(caught.value) and "differs from the sha256 recorded" in str(caught.value)


def test_every_metadata_file_is_covered_by_the_recorded_checksums(tmp_path: Path) -> None:
    zarr_cache(tmp_path)
    recorded = json.loads(CacheLayout(tmp_path).checksums.read_text())["files"]
    on_disk = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("zarr.json")}
    assert on_disk <= set(recorded) and "manifest.json" in recorded
    for name in sorted(recorded):
        path = tmp_path / name
        original = path.read_bytes()
        path.write_bytes(original + b" ")
        with pytest.raises(CacheOpenError, match=str(path)):
            open_cache(tmp_path, resolution=RESOLUTION, variant=VARIANT.name)
        path.write_bytes(original)


# -- webdataset ------------------------------------------------------------------------------------


def wds_cache(root: Path):
    content = make_content()
    writer = write_cache("wds", root, content)
    write_cache_manifest(writer, content, [RESOLUTION])
    return content, WdsCacheReader(root, RESOLUTION, VARIANT.name)


def member_offset(tar_path: Path, name: str) -> int:
    """Byte offset of member ``name``'s data in the tar file."""
    with tarfile.open(tar_path) as tar:
        return tar.getmember(name).offset_data


def test_a_flipped_frame_byte_in_a_tar_member_names_the_tar_and_the_sample(tmp_path: Path) -> None:
    content, reader = wds_cache(tmp_path)
    tar = CacheLayout(tmp_path).wds_shard(VARIANT.name, RESOLUTION, 1)
    key = content.sample_keys[4]
    flip_byte(tar, member_offset(tar, f"{encode_key(key)}.{FRAMES_MEMBER}") + 30)
    with pytest.raises(DamagedData) as caught:
        list(reader)
    assert (caught.value.file, caught.value.key) == (str(tar), key)
    assert "fail their crc32c" in str(caught.value)


def test_a_flipped_action_digit_is_damage_not_another_label(tmp_path: Path) -> None:
    content, reader = wds_cache(tmp_path)
    tar = CacheLayout(tmp_path).wds_shard(VARIANT.name, RESOLUTION, 0)
    key = content.sample_keys[1]
    start = member_offset(tar, f"{encode_key(key)}.json")
    data = tar.read_bytes()
    at = data.index(b'"action": ', start) + len(b'"action": ')
    assert data[at:at + 1] == str(content.actions[1]).encode()
    tar.write_bytes(data[:at] + b"3" + data[at + 1:])  # still valid JSON, another action
    with pytest.raises(DamagedData, match="json fails its crc32c") as caught:
        list(reader)
    assert caught.value.key == key


@pytest.mark.parametrize("member", ["json", FRAMES_MEMBER])
def test_a_damaged_tar_header_is_never_a_silently_shorter_shard(tmp_path: Path, member: str) -> None:
    """Python's tar reader stops quietly at a bad header after the first one: every sample of the
    shard is accounted for, read intact or counted in a damage that names the tar."""
    content, reader = wds_cache(tmp_path)
    tar = CacheLayout(tmp_path).wds_shard(VARIANT.name, RESOLUTION, 1)
    key = content.sample_keys[SAMPLES_PER_SHARD + 1]
    with tarfile.open(tar) as archive:
        header = archive.getmember(f"{encode_key(key)}.{member}").offset
    flip_byte(tar, header + 3)  # in the header's name field, covered by the header's checksum
    with pytest.raises(DamagedData) as caught:
        list(reader)
    assert caught.value.file == str(tar)
    items = list(reader.dataset(damaged="yield"))
    damage = [i for i in items if isinstance(i, DamagedData)]
    samples = [i for i in items if not isinstance(i, DamagedData)]
    assert damage and all(d.file == str(tar) for d in damage)
    assert len(samples) + sum(d.samples for d in damage) == content.n_samples
    assert content.sample_keys.index(key) not in [s.row for s in samples]
    for sample in samples:
        assert_sample_equal(sample, content, sample.row)


def test_streaming_can_yield_damage_in_place_of_the_samples_it_stands_for(tmp_path: Path) -> None:
    """``damaged="yield"`` (the trainer's skip policy): every intact sample arrives, in order, and
    each damage stands for the samples it made unreadable."""
    content, reader = wds_cache(tmp_path)
    tar = CacheLayout(tmp_path).wds_shard(VARIANT.name, RESOLUTION, 0)
    key = content.sample_keys[0]
    flip_byte(tar, member_offset(tar, f"{encode_key(key)}.feature.blosc") + 20)
    items = list(reader.dataset(damaged="yield"))
    damage = [i for i in items if isinstance(i, DamagedData)]
    assert len(damage) == 1 and damage[0].key == key and damage[0].samples == 1
    samples = [i for i in items if not isinstance(i, DamagedData)]
    assert [s.row for s in samples] == list(range(1, content.n_samples))
    for sample in samples:
        assert_sample_equal(sample, content, sample.row)


def test_a_missing_tar_shard_is_damage_naming_it(tmp_path: Path) -> None:
    content, reader = wds_cache(tmp_path)
    paths = reader.shard_paths()  # the stream's shard list is taken when it starts
    tar = CacheLayout(tmp_path).wds_shard(VARIANT.name, RESOLUTION, 2)
    tar.unlink()
    items = list(reader.dataset(damaged="yield"))
    assert str(tar) in map(str, paths)
    damage = [i for i in items if isinstance(i, DamagedData)]
    assert len(damage) == 1 and damage[0].file == str(tar) and damage[0].samples == SAMPLES_PER_SHARD


# -- through the trainer's datasets and DataLoader workers ---------------------------------------


def test_damage_crosses_dataloader_workers_as_a_value_with_its_one_line_message(tmp_path: Path) -> None:
    """The trainer's zarr dataset read by 2 worker processes: damaged samples arrive as values
    carrying the store's error (a worker's exception would arrive as traceback text); collate sets
    them aside."""
    from helpers.profiles import TINY_PROFILE
    from janus_core.profile import load_profile
    from janus_train.build import prompt_builder
    from janus_train.data.samples import CachedSamples, DamagedItem, TrainItem, collate

    content = make_content()
    writer = open_writer("zarr", tmp_path, VARIANT.name)
    writer.write_table("frames", {"key": content.frame_keys})
    writer.write_table("samples", {  # texts a prompt accepts (no empty description)
        "key": content.sample_keys, "window_rows": content.window_rows, "action": content.actions,
        **{column: [f"{column} of {key}" for key in content.sample_keys]
           for column in ("instruction", "subinstruction", "description_2d", "description_3d")}})
    writer.prepare_frames(RESOLUTION, (28, 28), FRAMES_PER_SHARD)
    writer.prepare_samples(RESOLUTION, tuple(content.features[RESOLUTION].shape[1:]), content.feature_dtype,
                           SAMPLES_PER_SHARD)
    write_frame_shards(writer, content, RESOLUTION, list(range(len(writer.frame_shard_plan(RESOLUTION)))))
    write_sample_shards(writer, content, RESOLUTION, list(range(len(writer.sample_shard_plan(RESOLUTION)))))
    reader = ZarrCacheReader(tmp_path, RESOLUTION, VARIANT.name)
    shard_file = reader.shard_file(FEATURES, 1)
    shard_file.unlink()
    dataset = CachedSamples(reader, prompt_builder(load_profile(TINY_PROFILE)))
    results = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=lambda x: x))
    damaged = {i for i, r in enumerate(results) if isinstance(r, DamagedItem)}
    assert damaged == {3, 4, 5}
    assert all(isinstance(r, TrainItem) and r.key == content.sample_keys[i]
               for i, r in enumerate(results) if i not in damaged)
    for row in damaged:
        err = results[row].error
        assert isinstance(err, MissingChunk) and err.file == str(shard_file) and err.key == content.sample_keys[row]
    assert collate([results[3], results[4]], pad_token_id=0) == {"damaged": [results[3].error, results[4].error]}
    batch = collate([results[2], results[3]], pad_token_id=0)
    assert batch["keys"] == [content.sample_keys[2]] and batch["damaged"] == [results[3].error]
