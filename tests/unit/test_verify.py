"""`janus-cache verify`: every kind of damage is caught by the check responsible for it.

Real caches are built once per session with the precompute entry point (tiny profile, zarr and
webdataset: ``verify_caches``) from a small generated dataset (2 episodes x 10 frames: padded and
linspace windows); verify runs in this process (two ranks under torchrun: tests/e2e/test_verify_ranks.py);
each test that damages something works on its own copy of the cache, the dataset or the encoder
checkpoint.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from helpers.shared_caches import VerifyCaches, step_of
from janus_cache.store import CacheLayout, read_manifest
from janus_cache.store.commit import read_record
from janus_cache.store.layout import FRAMES_TABLE, SAMPLES_TABLE
from janus_cache.store.layout import frames_array as frames_array_path
from janus_cache.verify import (
    CHECK_NAMES,
    FEATURE_TOLERANCES,
    LISTED,
    REPORT_SCHEMA_VERSION,
    CacheVerificationError,
    check_cache_for_training,
    choose_live_rows,
    compare,
    open_for_checks,
)
from janus_core.profile import PROFILES_DIR, load_profile
from janus_core.vggt.encoder import load_aggregator
from pipelines.cache_cli import app
from pipelines.verify import Options, run

TINY = PROFILES_DIR / "tiny.yaml"


@pytest.fixture(scope="module")
def built(verify_caches: VerifyCaches) -> VerifyCaches:
    """The session's caches of a small dataset (both formats, one sample failed at precompute)."""
    return verify_caches


@pytest.fixture
def dataset_copy(built: VerifyCaches, tmp_path: Path) -> Path:
    """A private copy of the dataset the caches were built from, for a test to change."""
    return Path(shutil.copytree(built.data, tmp_path / "data"))


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    report: dict[str, Any]

    def check(self, name: str) -> dict[str, Any]:
        return next(c for c in self.report["checks"] if c["name"] == name)

    def status(self) -> dict[str, str]:
        return {c["name"]: c["status"] for c in self.report["checks"]}

    def problems(self, name: str) -> str:
        return "\n".join(self.check(name)["problems"])


def verify(capsys: pytest.CaptureFixture[str], tmp_path: Path, cache: Path, data: Path | None = None,
           profile: str | Path = "tiny", live: int = 0, checksums: str = "all") -> Outcome:
    """Run the verify entry point in this process and collect its exit code, output and report."""
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*.json')))}.json"
    capsys.readouterr()
    code = run(Options(cache, data, str(profile), live, checksums, json_report=report))
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err, json.loads(report.read_text()))


def copy_cache(cache: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(cache, tmp_path / cache.name))


def write_profile(tmp_path: Path, name: str, cache: dict[str, Any] | None = None,
                  vggt: dict[str, Any] | None = None) -> Path:
    """The tiny profile with some settings changed, as a YAML file of its own."""
    data = yaml.safe_load(TINY.read_text())
    data["name"] = name
    data["vggt"]["config"] = str((TINY.parent / data["vggt"]["config"]).resolve())
    data["qwen"]["path"] = str((TINY.parent / data["qwen"]["path"]).resolve())
    data["cache"].update(cache or {})
    if vggt is not None:
        data["vggt"] = vggt
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def shard_rows(cache: Path, array: str, shard: int) -> range:
    record = read_record(cache, array, shard)
    assert record is not None
    return record.rows


def keys_of(cache: Path, table: str, rows: range) -> list[str]:
    return open_for_checks(cache).keys(table)[rows.start:rows.stop]


def features_array(cache: Path) -> str:
    manifest = read_manifest(cache)
    assert manifest is not None
    return next(a for a in manifest.shards if a.startswith("vggt/"))


# ---------------------------------------------------------------------------------- passing


@pytest.fixture(scope="module")
def clean_zarr_run(built: VerifyCaches, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """verify on the untouched zarr cache, with the dataset and four live samples."""
    report = tmp_path_factory.mktemp("clean") / "report.json"
    code = run(Options(built.zarr, built.data, "tiny", live=4, json_report=report))
    return Outcome(code, "", "", json.loads(report.read_text()))


def test_an_untouched_cache_passes_every_check_including_the_live_one(clean_zarr_run: Outcome, built: VerifyCaches) -> None:
    assert clean_zarr_run.code == 0
    assert clean_zarr_run.status() == {name: "pass" for name in CHECK_NAMES}
    # The sample that failed at precompute is expected to be absent, and said so.
    completeness = clean_zarr_run.check("completeness")
    assert completeness["data"]["failed_at_precompute"] == [built.failed]
    assert completeness["data"]["missing"] == []
    assert "1 failed at precompute" in completeness["detail"]
    live = clean_zarr_run.check("live")["data"]
    assert len(live["samples"]) == 4
    assert live["frames_identical"] is True and live["pixel_values_identical"] is True
    # Features and fused embeddings within the documented bounds (on the tiny CPU profile the
    # precompute and the live path run the same float32 arithmetic).
    assert live["feature"]["max_abs"] <= live["feature"]["min_bound"]
    assert live["feature"]["min_cosine"] >= live["tolerances"]["feature"]["min_cosine"]
    assert live["embeddings"] is not None, live["embeddings_note"]
    assert live["embeddings"]["max_abs"] <= live["embeddings"]["min_bound"]


def test_json_report_has_the_documented_stable_keys(clean_zarr_run: Outcome, built: VerifyCaches) -> None:
    report = clean_zarr_run.report
    assert set(report) == {"schema_version", "cache", "format", "data", "profile", "options", "world_size",
                           "passed", "seconds", "error", "checks"}
    assert report["schema_version"] == REPORT_SCHEMA_VERSION
    assert (report["format"], report["profile"], report["world_size"], report["passed"], report["error"]) == (
        "zarr", "tiny", 1, True, None)
    assert report["options"] == {"live": 4, "checksums": "all", "seed": 0}
    assert [c["name"] for c in report["checks"]] == list(CHECK_NAMES)
    for check in report["checks"]:
        assert set(check) == {"name", "status", "passed", "detail", "problems", "seconds", "data"}
    assert {"checksums", "shards", "hashed", "bad"} <= set(clean_zarr_run.check("integrity")["data"])
    assert {"missing", "extra", "changed_sources", "new_sources", "dataset_identity_matches"} <= set(
        clean_zarr_run.check("completeness")["data"])
    assert {"profile", "differences", "version_differences"} <= set(clean_zarr_run.check("freshness")["data"])
    sample = clean_zarr_run.check("live")["data"]["samples"][0]
    assert set(sample) == {"key", "row", "problem", "frames_identical", "pixel_values_identical",
                           "differing_sources", "feature", "embeddings", "vit"}
    assert sample["vit"] is None  # this cache holds no ViT features (cache.vit_features)
    assert set(sample["feature"]) == {"max_abs", "mean_abs", "cosine", "scale", "bound"}


def test_a_webdataset_cache_passes_the_same_checks_on_its_tar_samples(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outcome = verify(capsys, tmp_path, built.wds, built.data, live=2)
    assert outcome.code == 0, outcome.out
    assert outcome.report["format"] == "wds"
    assert outcome.status() == {name: "pass" for name in CHECK_NAMES}
    assert outcome.check("live")["data"]["frames_identical"] is True
    assert any(c["data"].get("shards") for c in outcome.report["checks"] if c["name"] == "integrity")


def test_without_data_the_dataset_checks_are_reported_as_skipped_not_passed(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outcome = verify(capsys, tmp_path, built.zarr, live=4)
    assert outcome.code == 0
    assert outcome.status()["live"] == "skip"
    assert "--data" in outcome.check("live")["detail"]
    assert "skipped (pass --data)" in outcome.check("completeness")["detail"]
    assert "skipped: live" in outcome.out


# ---------------------------------------------------------------------------------- integrity


def test_a_flipped_byte_in_a_feature_shard_fails_integrity_naming_the_shard_and_its_samples(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    array = features_array(cache)
    shard_file = cache / read_record(cache, array, 1).file
    raw = bytearray(shard_file.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard_file.write_bytes(bytes(raw))

    outcome = verify(capsys, tmp_path, cache)
    assert outcome.code == 1
    assert outcome.status()["integrity"] == "fail"
    assert outcome.status()["schema"] == "pass"
    problems = outcome.problems("integrity")
    assert f"{array}#1" in problems and "fails its checksum" in problems
    for key in keys_of(cache, SAMPLES_TABLE, shard_rows(cache, array, 1))[:LISTED]:
        assert key in problems
    bad = outcome.check("integrity")["data"]["bad"]
    assert [(b["shard"], b["holds"]) for b in bad] == [(f"{array}#1", "samples")]
    assert bad[0]["keys"] == keys_of(cache, SAMPLES_TABLE, shard_rows(cache, array, 1))
    assert "error: cache" in outcome.err and "integrity" in outcome.err


def test_a_truncated_frame_shard_fails_integrity_naming_its_frames(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    array = frames_array_path("pad224")
    shard_file = cache / read_record(cache, array, 0).file
    shard_file.write_bytes(shard_file.read_bytes()[:-100])

    outcome = verify(capsys, tmp_path, cache)
    assert outcome.code == 1
    problems = outcome.problems("integrity")
    assert f"{array}#0" in problems and "truncated" in problems
    assert keys_of(cache, FRAMES_TABLE, shard_rows(cache, array, 0))[0] in problems


def test_a_deleted_shard_file_fails_integrity(built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    array = features_array(cache)
    (cache / read_record(cache, array, 2).file).unlink()

    outcome = verify(capsys, tmp_path, cache, checksums="none")
    assert outcome.code == 1
    problems = outcome.problems("integrity")
    assert f"{array}#2" in problems and "is missing its file" in problems
    assert keys_of(cache, SAMPLES_TABLE, shard_rows(cache, array, 2))[0] in problems


def test_a_deleted_commit_record_fails_integrity_as_uncommitted(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    array = frames_array_path("pad224")
    rows = shard_rows(cache, array, 1)
    CacheLayout(cache).commit_record(array, 1).unlink()

    outcome = verify(capsys, tmp_path, cache, checksums="none")
    assert outcome.code == 1
    problems = outcome.problems("integrity")
    assert f"{array}#1" in problems and "not committed" in problems
    assert keys_of(cache, FRAMES_TABLE, rows)[0] in problems


def test_a_corrupted_tar_shard_of_a_webdataset_cache_is_named_with_its_samples(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.wds, tmp_path)
    array = next(a for a in read_manifest(cache).shards if a.startswith("wds/"))
    tar = cache / read_record(cache, array, 1).file
    raw = bytearray(tar.read_bytes())
    raw[2048] ^= 0xFF  # inside the first member's data
    tar.write_bytes(bytes(raw))

    outcome = verify(capsys, tmp_path, cache)
    assert outcome.code == 1
    problems = outcome.problems("integrity")
    assert "shard-000001.tar" in problems and "fails its checksum" in problems
    assert keys_of(cache, SAMPLES_TABLE, shard_rows(cache, array, 1))[0] in problems


def test_a_tar_shard_missing_a_member_fails_completeness_naming_the_sample(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.wds, tmp_path)
    array = next(a for a in read_manifest(cache).shards if a.startswith("wds/"))
    path = cache / read_record(cache, array, 0).file
    with tarfile.open(path) as source:
        members = [(m, source.extractfile(m).read()) for m in source.getmembers()]
    dropped = next(m for m, _ in members if m.name.endswith(".feature.blosc"))
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as target:
        for member, payload in members:
            if member is not dropped:
                target.addfile(member, io.BytesIO(payload))
    key = keys_of(cache, SAMPLES_TABLE, shard_rows(cache, array, 0))[0]

    outcome = verify(capsys, tmp_path, cache)
    assert outcome.code == 1
    assert outcome.status()["completeness"] == "fail"
    assert f"{path.name} has samples without all of" in outcome.problems("completeness")
    assert key in outcome.problems("completeness")


def test_damaged_array_metadata_fails_schema_and_integrity_instead_of_crashing(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    (cache / "tables/samples/step/zarr.json").write_text("{not json")
    outcome = verify(capsys, tmp_path, cache)
    assert outcome.code == 1
    assert "tables/samples/step: cannot be opened" in outcome.problems("schema")
    assert "array tables/samples/step cannot be opened" in outcome.problems("integrity")


def test_checksum_modes_choose_which_shards_are_hashed_but_all_are_checked_for_presence(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    array = features_array(cache)
    shard_file = cache / read_record(cache, array, 0).file
    raw = bytearray(shard_file.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # same size: only a checksum can see it
    shard_file.write_bytes(bytes(raw))

    unhashed = verify(capsys, tmp_path, cache, checksums="none")
    assert unhashed.status()["integrity"] == "pass"
    assert unhashed.check("integrity")["data"]["hashed"] == 0

    sampled = verify(capsys, tmp_path, cache, checksums="sample").check("integrity")["data"]
    assert 0 < sampled["hashed"] < sampled["shards"]

    CacheLayout(cache).commit_record(array, 2).unlink()
    assert verify(capsys, tmp_path, cache, checksums="none").status()["integrity"] == "fail"


# ---------------------------------------------------------------------------------- completeness


def _change_image(path: Path) -> None:
    image = np.array(Image.open(path).convert("RGB"))
    image[100:300, 100:400] = 255 - image[100:300, 100:400]
    Image.fromarray(image).save(path)


def test_a_source_image_changed_after_precompute_fails_completeness_and_the_live_check(
        built: VerifyCaches, dataset_copy: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Change the newest frame of a sample the live check picks, so both checks see it.
    row = choose_live_rows(built.zarr, 1, seed=0)[0]
    key = open_for_checks(built.zarr).keys(SAMPLES_TABLE)[row]
    episode, step = key.split("/")
    source = next(p for p in (dataset_copy / episode).glob("step_*.png") if step_of(p) == int(step))
    _change_image(source)

    outcome = verify(capsys, tmp_path, built.zarr, dataset_copy, live=1)
    assert outcome.code == 1
    assert outcome.status()["completeness"] == "fail"
    relpath = source.relative_to(dataset_copy).as_posix()
    assert f"changed source file {relpath}" in outcome.problems("completeness")
    assert "content hash" in outcome.problems("completeness")
    assert outcome.check("completeness")["data"]["changed_sources"] == [relpath]
    assert outcome.status()["live"] == "fail"
    assert f"sample {key}: cached uint8 frames differ" in outcome.problems("live")
    assert relpath in outcome.problems("live")


def _addstep_of(dataset: Path) -> str:
    """Append one more frame (and so one more sample) to the first episode; returns its key."""
    episode = min(p for p in dataset.iterdir() if p.is_dir())
    last = max(episode.glob("step_*.png"), key=step_of)
    step = step_of(last) + 1
    new = episode / f"step_{step:04d}_{last.stem.split('_', 2)[2]}.png"
    shutil.copyfile(last, new)
    shutil.copyfile(last.with_suffix(".json"), new.with_suffix(".json"))
    return f"{episode.name}/{step}"


def test_a_sample_missing_from_the_cache_fails_completeness(
        built: VerifyCaches, dataset_copy: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    key = _addstep_of(dataset_copy)
    outcome = verify(capsys, tmp_path, built.zarr, dataset_copy)
    assert outcome.code == 1
    assert outcome.status()["completeness"] == "fail"
    data = outcome.check("completeness")["data"]
    assert data["missing"] == [key]
    assert data["extra"] == [] and data["changed_sources"] == []
    assert f"missing from the cache: {key}" in outcome.problems("completeness")
    assert "dataset identity differs" in outcome.problems("completeness")


def test_a_cached_sample_the_dataset_no_longer_has_fails_completeness(
        built: VerifyCaches, dataset_copy: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    episode = sorted(p for p in dataset_copy.iterdir() if p.is_dir())[1]
    description = next(p for p in episode.glob("step_*.json") if step_of(p) == 5)
    description.unlink()  # the frame stays (a history frame), the sample is gone

    outcome = verify(capsys, tmp_path, built.zarr, dataset_copy)
    assert outcome.code == 1
    assert outcome.check("completeness")["data"]["extra"] == [f"{episode.name}/5"]
    assert f"not in the dataset index: {episode.name}/5" in outcome.problems("completeness")


# ---------------------------------------------------------------------------------- freshness


@pytest.mark.parametrize(
    ("change", "field", "cache_value", "profile_value"),
    [
        ({"resolution": "pad252"}, "resolution", "['pad224']", "'pad252'"),
        ({"reference_frame": "first"}, "window.reference_frame", "'last'", "'first'"),
    ],
)
def test_a_profile_with_other_settings_fails_freshness_naming_the_field_and_both_values(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        change: dict[str, Any], field: str, cache_value: str, profile_value: str) -> None:
    profile = write_profile(tmp_path, "changed", cache=change)
    outcome = verify(capsys, tmp_path, built.zarr, profile=profile)
    assert outcome.code == 1
    assert outcome.status()["freshness"] == "fail"
    assert f"{field}: cache has {cache_value}, profile changed has {profile_value}" in outcome.problems("freshness")
    assert outcome.status()["schema"] == outcome.status()["integrity"] == "pass"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile's seeded random encoder saved as a VGGT checkpoint directory."""
    profile = load_profile("tiny")
    model = load_aggregator(profile.vggt, profile.cache.attention)
    directory = tmp_path_factory.mktemp("checkpoint") / "tiny-vggt"
    directory.mkdir()
    save_file({f"aggregator.{k}": v.contiguous() for k, v in model.state_dict().items()},
              directory / "model.safetensors")
    config = {k: v for k, v in model.config.to_dict().items()}
    (directory / "config.json").write_text(json.dumps({"aggregator": config}))
    return directory


def test_one_changed_encoder_weight_fails_freshness_and_the_live_features(
        built: VerifyCaches, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The same weights from a checkpoint file have the same fingerprint: the cache is fresh.
    same = write_profile(tmp_path, "checkpoint", vggt={"path": str(tiny_checkpoint)})
    assert verify(capsys, tmp_path, built.zarr, profile=same).code == 0

    changed_dir = Path(shutil.copytree(tiny_checkpoint, tmp_path / "changed-vggt"))
    weights = load_file(changed_dir / "model.safetensors")
    weights["aggregator.patch_embed.patch_embed.proj.weight"][0, 0, 0, 0] += 0.5  # one weight of the patch embedding
    save_file(weights, changed_dir / "model.safetensors")
    changed = write_profile(tmp_path, "changed-weight", vggt={"path": str(changed_dir)})

    outcome = verify(capsys, tmp_path, built.zarr, built.data, profile=changed, live=1)
    assert outcome.code == 1
    assert outcome.status()["freshness"] == "fail"
    assert "encoder_fingerprint: cache has" in outcome.problems("freshness")
    assert outcome.status()["live"] == "fail"
    assert "VGGT feature max abs error" in outcome.problems("live")
    assert outcome.check("live")["data"]["frames_identical"] is True


# ---------------------------------------------------------------------------------- the trainer


def test_the_trainer_check_accepts_a_fresh_cache_and_refuses_a_stale_one_with_the_cli_message(
        built: VerifyCaches, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    results = check_cache_for_training(built.zarr, "tiny")
    assert [(r.name, r.status) for r in results] == [("schema", "pass"), ("integrity", "pass"), ("freshness", "pass")]

    stale = write_profile(tmp_path, "stale", cache={"reference_frame": "first"})
    with pytest.raises(CacheVerificationError) as refused:
        check_cache_for_training(built.zarr, stale)
    assert "window.reference_frame: cache has 'last', profile stale has 'first'" in str(refused.value)
    outcome = verify(capsys, tmp_path, built.zarr, profile=stale)
    assert f"error: {refused.value}" in outcome.err


def test_the_trainer_check_refuses_a_truncated_shard_without_hashing_every_byte(
        built: VerifyCaches, tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    shard = cache / read_record(cache, frames_array_path("pad224"), 0).file
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CacheVerificationError, match=r"integrity.*frames/pad224#0.*truncated"):
        check_cache_for_training(cache, "tiny")


def test_a_directory_without_a_manifest_fails_schema_and_skips_the_rest(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "not-a-cache"
    empty.mkdir()
    outcome = verify(capsys, tmp_path, empty)
    assert outcome.code == 1
    assert outcome.status() == {"schema": "fail", **{name: "skip" for name in CHECK_NAMES[1:]}}
    assert "no manifest.json" in outcome.problems("schema")
    with pytest.raises(CacheVerificationError, match="no manifest.json"):
        check_cache_for_training(empty, "tiny")


# ---------------------------------------------------------------------------------- library


def test_the_feature_tolerance_admits_one_bf16_ulp_but_not_a_one_percent_error() -> None:
    tolerance = FEATURE_TOLERANCES["cpu"]
    cached = torch.randn(256, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    # Every value one bf16 step further from zero: what a tiny compute difference can do after rounding.
    one_ulp = (cached.view(torch.int16) + 1).view(torch.bfloat16)
    close = compare(one_ulp, cached, tolerance, "bfloat16")
    assert close.ok and 0 < close.max_abs <= close.bound
    far = compare((cached.float() * 1.01).to(torch.bfloat16), cached, tolerance, "bfloat16")
    assert not far.ok and far.max_abs > far.bound


def test_the_library_checks_run_in_one_process_on_an_explicit_subset(built: VerifyCaches) -> None:
    from janus_cache.verify import check_integrity, check_live, check_schema
    from janus_core.index import build_index

    assert check_schema(built.zarr).passed
    integrity = check_integrity(built.zarr, checksums="sample", seed=3)
    assert integrity.passed and integrity.data["hashed"] < integrity.data["shards"]
    index = build_index(built.data, history=load_profile("tiny").cache.history)
    n = len(open_for_checks(built.wds).keys(SAMPLES_TABLE))
    live = check_live(built.wds, "tiny", index, rows=[0, n - 1])
    assert live.passed, live.problems
    assert [s["row"] for s in live.data["samples"]] == [0, n - 1]
    assert live.data["embeddings"] is None and live.data["embeddings_note"] == "not asked for"
    outside = check_live(built.wds, "tiny", index, rows=[n])
    assert outside.failed and f"sample rows [{n}] are out of range" in outside.problems[0]


# ---------------------------------------------------------------------------------- commands


def test_the_cli_command_exits_1_with_a_one_line_reason_on_a_damaged_cache(built: VerifyCaches, tmp_path: Path) -> None:
    cache = copy_cache(built.zarr, tmp_path)
    CacheLayout(cache).commit_record(frames_array_path("pad224"), 0).unlink()
    result = CliRunner().invoke(app, ["verify", str(cache), "--checksums", "none"])
    assert result.exit_code == 1
    assert any(line.startswith("integrity") and "FAIL" in line for line in result.output.splitlines())
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "frames/pad224#0" in errors[0]
