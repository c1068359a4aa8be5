"""Repair, never harm: re-running precompute repairs a damaged cache and says what it rewrote; a
failed run leaves a good cache exactly as it was.

Real precompute runs (the ``janus-cache precompute`` entry point, in this process) on copies of
the session's shared sample-data cache; the repaired cache must be byte-identical to the undamaged
one, so nothing is "repaired" into another state.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.profiles import REPO_ROOT, file_digests, write_test_profile
from helpers.shared_caches import SMALL_SHARDS
from helpers.precompute_runs import RESOLUTION, copy_cache, flip_byte, output, run_in_process, succeeded, tail
from helpers.sources import janus_cache_in_process

from janus_cache.store import CacheLayout, ZarrCacheReader, read_manifest
from janus_cache.store.layout import features_array, frames_array, table_column
from janus_cache.verify import check_integrity, check_schema

FRAMES = frames_array(RESOLUTION)


@pytest.fixture(scope="module")
def profile(small_shards_profile: Path) -> Path:
    """The tiny profile with small shards (several shards per array), as in test_precompute."""
    return small_shards_profile


@pytest.fixture(scope="module")
def reference(small_shards_cache: Callable[[str], Path]) -> Callable[[str], Path]:
    """An intact cache per format: the session's shared one (never modified: tests damage copies)."""
    return small_shards_cache


Rerun = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def rerun(capsys: pytest.CaptureFixture[str]) -> Rerun:
    """The precompute again over a cache: the entry point ``janus-cache precompute`` runs, in this
    process (exit code and output as a finished process's; the command itself: test_precompute)."""
    def again(data: Path, cache: Path, profile: Path, cache_format: str = "zarr") -> subprocess.CompletedProcess[str]:
        return run_in_process(capsys, data, cache, profile, cache_format=cache_format)

    return again


def assert_verifies(cache: Path) -> None:
    for result in (check_schema(cache), check_integrity(cache, checksums="all")):
        assert result.passed, result.problems


def variant_of(cache: Path) -> str:
    manifest = read_manifest(cache)
    assert manifest is not None
    return manifest.window.name


def test_a_rerun_repairs_damaged_shards_records_and_zarr_json_and_says_what_it_rewrote(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    """A truncated frames shard, a deleted features shard, a commit record that is not JSON and an
    edited ``"endian"``: the re-run rewrites exactly those and the cache is byte-identical again."""
    intact = reference("zarr")
    cache = copy_cache(intact, tmp_path / "cache")
    reader = ZarrCacheReader(cache, RESOLUTION, variant_of(cache))
    features = features_array(variant_of(cache), RESOLUTION)
    frames_shard, features_shard = reader.shard_file(FRAMES, 2), reader.shard_file(features, 5)
    frames_shard.write_bytes(frames_shard.read_bytes()[:-100])
    features_shard.unlink()
    record = CacheLayout(cache).commit_record(features, 7)
    record.write_text("not JSON {")
    meta = cache / features / "zarr.json"
    meta.write_text(meta.read_text().replace('"little"', '"big"'))

    result = rerun(sample_dataset, cache, profile)
    assert succeeded(result), tail(result)
    said = output(result)
    assert f"{features}/zarr.json" in said
    rewrote = next(line for line in said.splitlines() if "rewrote 3 shards" in line)
    # Damage is said as damage (an append's growth of a partly filled shard is not: test_append).
    assert rewrote.startswith("  repaired: rewrote 3 shards that failed their commit records: "), rewrote
    assert "partly filled" not in said
    for shard in (frames_shard, features_shard, reader.shard_file(features, 7)):
        assert shard.relative_to(cache).as_posix() in rewrote
    assert file_digests(cache) == file_digests(intact)
    assert_verifies(cache)


def test_a_rerun_rewrites_a_table_with_a_flipped_byte(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    intact = reference("zarr")
    cache = copy_cache(intact, tmp_path / "cache")
    text = ZarrCacheReader(cache, RESOLUTION, variant_of(cache)).shard_file(
        table_column("samples", "instruction", "utf8"), 0)
    data = bytearray(text.read_bytes())
    data[40] ^= 1
    text.write_bytes(bytes(data))
    assert not check_schema(cache).passed or not check_integrity(cache).passed

    result = rerun(sample_dataset, cache, profile)
    assert succeeded(result), tail(result)
    assert "table samples" in output(result)
    assert file_digests(cache) == file_digests(intact)


def test_a_rerun_rebuilds_a_damaged_manifest_whose_settings_the_checksums_prove(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    intact = reference("zarr")
    cache = copy_cache(intact, tmp_path / "cache")
    manifest = cache / "manifest.json"
    manifest.write_text(manifest.read_text()[:200])

    result = rerun(sample_dataset, cache, profile)
    assert succeeded(result), tail(result)
    assert "manifest.json (damaged; rebuilt" in output(result)
    assert file_digests(cache) == file_digests(intact)


def test_a_rerun_restores_a_manifest_edited_outside_its_keyed_settings(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    intact = reference("zarr")
    cache = copy_cache(intact, tmp_path / "cache")
    manifest = cache / "manifest.json"
    data = json.loads(manifest.read_text())
    data["counts"]["samples_written"] -= 1
    manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert not check_schema(cache).passed  # differs from the sha256 recorded for it

    result = rerun(sample_dataset, cache, profile)
    assert succeeded(result), tail(result)
    assert "manifest.json (edited outside its keyed settings)" in output(result)
    assert file_digests(cache) == file_digests(intact)


def test_a_damaged_manifest_of_other_settings_is_one_line_naming_it_and_the_fix(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, tmp_path: Path,
) -> None:
    """The checksums record the damaged manifest's keyed settings; a run with other settings cannot
    prove them, so it neither guesses nor touches the cache."""
    cache = copy_cache(reference("zarr"), tmp_path / "cache")
    manifest = cache / "manifest.json"
    manifest.write_text(manifest.read_text()[:200])
    before = file_digests(cache)
    other = write_test_profile(tmp_path / "other.yaml", cache=SMALL_SHARDS, vggt={"seed": 1})

    result = rerun(sample_dataset, cache, other)
    assert not succeeded(result)
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and str(manifest) in error[0] and "--overwrite" in error[0], tail(result)
    assert "Traceback" not in output(result)
    assert file_digests(cache) == before


def test_a_failed_rerun_after_a_text_edit_leaves_the_good_cache_as_it_was(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    """The failed run leaves the manifest with its shard table, so the good cache still passes its
    schema check."""
    intact = reference("zarr")
    cache = copy_cache(intact, tmp_path / "cache")
    data = Path(shutil.copytree(sample_dataset, tmp_path / "data"))
    step = min((data / "episode_0001").glob("step_0003_*.json"))
    texts = json.loads(step.read_text())
    texts["landmark_description"] = "An edited description of a green door."
    step.write_text(json.dumps(texts, indent=2))

    result = rerun(data, cache, profile)
    assert not succeeded(result)
    assert "Traceback" not in output(result), tail(result)
    assert file_digests(cache) == file_digests(intact)
    assert_verifies(cache)


def test_a_wds_rerun_repairs_a_truncated_tar_and_an_edited_layout(
    reference: Callable[[str], Path], rerun: Rerun, sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    intact = reference("wds")
    cache = copy_cache(intact, tmp_path / "cache")
    paths = CacheLayout(cache)
    variant = variant_of(cache)
    tar = paths.wds_shard(variant, RESOLUTION, 3)
    tar.write_bytes(tar.read_bytes()[:1500])
    layout = paths.wds_layout(variant, RESOLUTION)
    layout.write_text(layout.read_text().replace("\n", "\n ", 1))

    result = rerun(sample_dataset, cache, profile, cache_format="wds")
    assert succeeded(result), tail(result)
    said = output(result)
    assert layout.relative_to(cache).as_posix() in said
    assert tar.relative_to(cache).as_posix() in next(line for line in said.splitlines() if "rewrote 1 shard" in line)
    assert file_digests(cache) == file_digests(intact)
    assert_verifies(cache)


def documented_repair_options() -> list[str]:
    """The options of docs/precompute.md's repair line (its words after ``--out CACHE``)."""
    text = (REPO_ROOT / "docs" / "precompute.md").read_text()
    section = text[text.index("## Integrity and repair"):text.index("## Resume at scale")]
    line = next(line for line in section.splitlines() if "janus-cache precompute" in line)
    words = shlex.split(line.split("#")[0])
    return words[words.index("--out") + 2:]


def test_the_documented_repair_and_verifys_own_repair_command_repair_bit_rot_and_a_deleted_shard(
    reference: Callable[[str], Path], sample_dataset: Path, profile: Path, tmp_path: Path,
) -> None:
    """A flipped byte in a feature shard (same size: only hashing sees it) and a deleted frames shard:
    verify fails and its ``error:`` line ends with the command that repairs both; that command, and
    docs/precompute.md's repair line, each give the intact cache byte for byte (before: the
    documented line rewrote the deleted shard only, and verify named no fix). A deleted shard alone
    needs no hashing, and verify's command asks for none."""
    intact = reference("zarr")
    features = features_array(variant_of(intact), RESOLUTION)

    def damaged(name: str, flip: bool = True) -> Path:
        cache = copy_cache(intact, tmp_path / name)
        reader = ZarrCacheReader(cache, RESOLUTION, variant_of(cache))
        if flip:
            flip_byte(reader.shard_file(features, 1))
        reader.shard_file(FRAMES, 1).unlink()
        return cache

    def verify(cache: Path) -> subprocess.CompletedProcess[str]:
        return janus_cache_in_process("verify", cache, "--profile", profile, "--data", sample_dataset, "--live", "0")

    cache = damaged("verify-s-command")
    failed = verify(cache)
    assert failed.returncode == 1
    error = failed.stderr.strip().splitlines()[-1]
    repair = (f"janus-cache precompute {sample_dataset} --out {cache} --profile {profile} --checksums all")
    assert error.startswith("error: ") and error.endswith(f"; repair it with: {repair}"), error
    repaired = janus_cache_in_process(*shlex.split(repair)[1:], "--workers", "1")
    assert succeeded(repaired), tail(repaired)
    assert file_digests(cache) == file_digests(intact)
    assert verify(cache).returncode == 0

    assert documented_repair_options() == ["--checksums", "all"]
    cache = damaged("documented")
    repaired = janus_cache_in_process("precompute", sample_dataset, "--out", cache, "--profile", profile,
                                      "--workers", "1", *documented_repair_options())
    assert succeeded(repaired), tail(repaired)
    assert file_digests(cache) == file_digests(intact)

    error = verify(damaged("deleted-only", flip=False)).stderr.strip().splitlines()[-1]
    assert error.endswith(f"; repair it with: janus-cache precompute {sample_dataset} --out {tmp_path / 'deleted-only'} "
                          f"--profile {profile}"), error
