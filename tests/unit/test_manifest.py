"""Cache manifest: stable JSON, keyed differences named with both values, atomic single-writer file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import janus_core.system.files as files_module
from janus_cache.store import (
    DatasetIdentity,
    FieldDiff,
    Manifest,
    ManifestError,
    ManifestMismatch,
    ResolutionEntry,
    ShardEntry,
    ShardSizes,
    WindowVariant,
    check_compatible,
    keyed_differences,
    read_manifest,
    write_manifest,
)
from janus_cache.store.manifest import (
    SCHEMA_VERSION,
    library_versions,
    merge_manifests,
    version_differences,
)
from janus_core.index import EpisodeIdentity

EPISODES = [
    EpisodeIdentity("ep0", "r2r", "aa" * 32, frames=2, samples=2),
    EpisodeIdentity("ep1", "r2r", "bb" * 32, frames=1, samples=1),
]


def pad644(**changes: object) -> ResolutionEntry:
    entry = ResolutionEntry("pad644", {"mode": "pad", "target": 644}, (644, 644, 3), (2116, 2048))
    return replace(entry, **changes)


def manifest(**changes: object) -> Manifest:
    base = Manifest(
        format="zarr",
        window=WindowVariant(history=8, sampling="linspace", reference_frame="first", layer=-2, attention="causal"),
        encoder_fingerprint="sha256:" + "12" * 32,
        feature_dtype="bfloat16",
        dataset=DatasetIdentity.compute(EPISODES, sources=["r2r"]),
        layout=ShardSizes(frames_per_shard=64, samples_per_shard=16),
        resolutions={"pad644": pad644()},
        counts={"frames": 3, "samples": 3},
        shards={"frames/pad644": (ShardEntry(0, 0, 3, True, 1234, "ab" * 32),)},
        compression={"frames": {"cname": "zstd", "clevel": 5, "shuffle": "bitshuffle"}},
        versions=library_versions(),
    )
    return replace(base, **changes)


# -- serialisation -------------------------------------------------------------------------------


def test_json_round_trip_is_exact_and_stable_with_sorted_keys() -> None:
    original = manifest()
    text = original.to_json()
    assert Manifest.from_json(text) == original
    assert Manifest.from_json(text).to_json() == text
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION
    assert (data["feature_dtype"], data["stored_dtype"]) == ("bfloat16", "uint16")
    assert data["resolutions"]["pad644"]["feature_shape"] == [2116, 2048]


def test_stored_dtype_follows_the_logical_feature_dtype(tmp_path: Path) -> None:
    assert manifest().stored_dtype == "uint16"
    assert manifest(feature_dtype="float32").stored_dtype == "float32"
    data = manifest().to_dict()
    data["stored_dtype"] = "float16"
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="bfloat16 features are stored as 'float16'; they are stored as 'uint16'"):
        read_manifest(tmp_path)


def test_dataset_identity_changes_with_any_episode_field_or_order_and_is_deterministic() -> None:
    base = DatasetIdentity.compute(EPISODES)
    assert base == DatasetIdentity.compute(list(EPISODES))
    assert (base.n_episodes, base.n_frames, base.n_samples) == (2, 3, 3)
    changed = [
        DatasetIdentity.compute([replace(EPISODES[0], digest="dd" * 32), *EPISODES[1:]]),
        DatasetIdentity.compute([replace(EPISODES[0], episode_id="ep2"), *EPISODES[1:]]),
        DatasetIdentity.compute([replace(EPISODES[0], source="rxr"), *EPISODES[1:]]),
        DatasetIdentity.compute([replace(EPISODES[0], frames=3), *EPISODES[1:]]),
        DatasetIdentity.compute(EPISODES[::-1]),
        DatasetIdentity.compute(EPISODES[:1]),
    ]
    assert len({base.digest, *(c.digest for c in changed)}) == 1 + len(changed)


def test_window_variant_name_is_path_safe_and_spells_out_every_setting() -> None:
    variant = WindowVariant(history=8, sampling="linspace", reference_frame="last", layer=-2, attention="full")
    assert variant.name == "h8_linspace_ref-last_layer-2_full"
    assert variant.frames == 9
    with pytest.raises(ValueError, match="reference_frame"):
        WindowVariant(history=8, sampling="linspace", reference_frame="middle", layer=-2, attention="causal")
    with pytest.raises(ValueError, match="sampling rule name"):
        WindowVariant(history=8, sampling="lin/space", reference_frame="first", layer=-2, attention="causal")


# -- keyed differences ---------------------------------------------------------------------------


def test_keyed_differences_name_every_differing_field_with_both_values() -> None:
    existing = manifest()
    wanted = manifest(
        window=replace(existing.window, history=4, attention="full"),
        encoder_fingerprint="sha256:" + "34" * 32,
        resolutions={"pad644": pad644(preprocessing={"mode": "crop", "target": 644})},
        dataset=DatasetIdentity.compute(EPISODES[:1], sources=["r2r"]),
    )
    diffs = {d.name: (d.existing, d.wanted) for d in keyed_differences(existing, wanted)}
    assert diffs["window.history"] == (8, 4)
    assert diffs["window.attention"] == ("causal", "full")
    assert diffs["encoder_fingerprint"] == (existing.encoder_fingerprint, wanted.encoder_fingerprint)
    assert diffs["resolutions.pad644.preprocessing.mode"] == ("pad", "crop")
    assert diffs["dataset.digest"] == (existing.dataset.digest, wanted.dataset.digest)
    assert diffs["dataset.n_frames"] == (3, 2)
    assert "window.layer" not in diffs and "resolutions.pad644.frame_shape" not in diffs


def test_recorded_fields_never_make_a_cache_incompatible() -> None:
    existing = manifest()
    wanted = manifest(counts={"frames": 1}, shards={}, compression={}, versions={**existing.versions, "zarr": "9.9"})
    assert keyed_differences(existing, wanted) == []
    assert version_differences(existing, wanted) == [FieldDiff("versions.zarr", existing.versions["zarr"], "9.9")]


def test_a_new_resolution_is_an_addition_and_merging_keeps_both() -> None:
    existing = manifest()
    pad224 = ResolutionEntry("pad224", {"mode": "pad", "target": 224}, (224, 224, 3), (256, 2048))
    wanted = manifest(resolutions={"pad224": pad224}, shards={"frames/pad224": (ShardEntry(0, 0, 3, False),)})
    assert keyed_differences(existing, wanted) == []
    merged = merge_manifests(existing, wanted)
    assert list(merged.resolutions) == ["pad224", "pad644"]
    assert list(merged.shards) == ["frames/pad224", "frames/pad644"]


def test_mismatch_error_message_names_the_fields_and_both_values() -> None:
    existing = manifest()
    wanted = manifest(layout=ShardSizes(frames_per_shard=32, samples_per_shard=16), format="wds")
    with pytest.raises(ManifestMismatch) as caught:
        check_compatible(existing, wanted, source="cache /data/c")
    message = str(caught.value)
    assert message.startswith("cache /data/c was made with different settings")
    assert "format: cache has 'zarr', wanted 'wds'" in message
    assert "layout.frames_per_shard: cache has 64, wanted 32" in message
    assert [d.name for d in caught.value.differences] == ["format", "layout.frames_per_shard"]
    with pytest.raises(ManifestMismatch, match="window.reference_frame"):
        merge_manifests(existing, manifest(window=replace(existing.window, reference_frame="last")))


# -- files ---------------------------------------------------------------------------------------


def test_write_then_read_gives_the_same_manifest_and_no_temporary_files(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None
    path = write_manifest(tmp_path, manifest())
    assert path == tmp_path / "manifest.json"
    assert read_manifest(tmp_path) == manifest()
    write_manifest(tmp_path, manifest(counts={"frames": 3, "samples": 2}))
    assert read_manifest(tmp_path).counts == {"frames": 3, "samples": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checksums.json", "manifest.json"]


def test_a_crash_during_a_manifest_write_leaves_the_previous_manifest_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_manifest(tmp_path, manifest())
    before = (tmp_path / "manifest.json").read_bytes()

    def crash(src: object, dst: object) -> None:
        raise KeyboardInterrupt("killed before the rename")

    with monkeypatch.context() as patch:
        patch.setattr(files_module.os, "replace", crash)  # the atomic write's rename
        with pytest.raises(KeyboardInterrupt):
            write_manifest(tmp_path, manifest(counts={"frames": 0}))
    assert (tmp_path / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checksums.json", "manifest.json"]


def test_unreadable_manifests_are_errors_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text("{not json")
    with pytest.raises(ManifestError, match=f"{path} is not valid JSON"):
        read_manifest(tmp_path)
    data = manifest().to_dict()
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=f"{path} has schema_version 99; this janus reads schema_version {SCHEMA_VERSION}"):
        read_manifest(tmp_path)
    data = manifest().to_dict()
    del data["window"]
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=f"{path} lacks the field 'window'"):
        read_manifest(tmp_path)
