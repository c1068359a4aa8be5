"""What resume and verify cost, what they trust, and what a disk that fills up mid-run does.

* A resume with nothing to do trusts committed shards by commit record and byte size: it opens no
  frame or feature shard file (observed with a Python audit hook on every ``open``, in a real
  ``janus-cache precompute`` process); ``--checksums all`` re-hashes them and rewrites a damaged one.
* ``verify --checksums all|sample|none``: a flipped payload byte is found by ``all``, by ``sample``
  when its shard is in the documented subset (one in 16, chosen by the seed), never by ``none``.
* Hashing shows progress with a rate and an ETA, as a tqdm bar on a terminal and as log lines
  otherwise.
* A disk that fills up mid-run (a real, size-limited tmpfs in an unprivileged user+mount
  namespace: the kernel's own ENOSPC) ends a 2-rank run with one ``error:`` line with real byte
  counts; the same command, once there is room, finishes the cache byte-identical to a run that
  never failed.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from helpers.profiles import REPO_ROOT, file_digests, write_test_profile
from helpers.sources import janus_cache_in_process
from janus_cache.store.commit import SAMPLE_STRIDE, commit_shard, hashed, read_record
from janus_cache.store.layout import (
    FEATURES_GROUP,
    FRAMES_GROUP,
    TABLES_GROUP,
    CacheLayout,
    features_array,
    frames_array,
)
from janus_cache.store.manifest import read_manifest
from janus_cache.verify import check_cache_for_training, check_integrity
from janus_core.system.lock import LOCK_NAME
from pipelines import precompute_run
from pipelines.distributed import CommitTally

RESOLUTION = "pad224"
FRAMES_PER_SHARD = 2
SAMPLES_PER_SHARD = 2  # the sample data's 36 frames and 36 samples: 18 shards each, more than 16
TIMEOUT = 600
JANUS_CACHE = str(Path(sys.executable).parent / "janus-cache")
AUDIT = str(REPO_ROOT / "tests" / "helpers" / "open_audit.py")


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO_ROOT, env=env(), capture_output=True, text=True, timeout=TIMEOUT,
                          check=False, **kwargs)


def digests(cache: Path) -> dict[str, str]:
    """Every file of a cache but the lock file of the last run that held it."""
    return {path: digest for path, digest in file_digests(cache).items() if path != LOCK_NAME}


def flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # same size: only a checksum sees it
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_profile(tmp_path_factory.mktemp("profile") / "small-shards.yaml",
                              cache={"frames_per_shard": FRAMES_PER_SHARD, "samples_per_shard": SAMPLES_PER_SHARD,
                                     "resolution": RESOLUTION})


@pytest.fixture(scope="module")
def reference(sample_dataset: Path, profile: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache built by one uninterrupted run (in this process)."""
    out = tmp_path_factory.mktemp("reference") / "cache"
    assert precompute_run.run(precompute_run.Options(sample_dataset, out, str(profile), workers=1)) == 0
    return out


@pytest.fixture
def cache(reference: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(reference, tmp_path / "cache"))


def shard_file(cache: Path, array: str, shard: int) -> Path:
    record = read_record(cache, array, shard)
    assert record is not None
    return cache / record.file


def feature_array(cache: Path) -> str:
    manifest = read_manifest(cache)
    assert manifest is not None
    return features_array(manifest.window.name, RESOLUTION)


def audited_precompute(data: Path, cache: Path, profile: Path, log: Path, *args: str) -> tuple[str, set[Path]]:
    """Run ``janus-cache precompute`` under the open audit; its output and the shard files it read."""
    result = run([sys.executable, AUDIT, str(log), "--", "janus-cache", "precompute", str(data), "--out", str(cache),
                  "--profile", str(profile), "--workers", "1", *args])
    assert result.returncode == 0, result.stdout + result.stderr
    opened = {Path(line) for line in log.read_text().splitlines()}
    payload = {p for p in opened if p.is_relative_to(cache) and p != cache and p.is_file()
               and p.name != "zarr.json" and p.relative_to(cache).parts[0] in (FRAMES_GROUP, FEATURES_GROUP)}
    return result.stdout + result.stderr, payload


# ------------------------------------------------------------------------------------ resume


def test_a_resume_with_nothing_to_do_reads_no_shard_payload_unless_asked_to_hash(
        sample_dataset: Path, profile: Path, cache: Path, tmp_path: Path) -> None:
    before = digests(cache)
    out, read = audited_precompute(sample_dataset, cache, profile, tmp_path / "none.log")
    assert read == set(), f"the resume read {len(read)} shard files: {sorted(map(str, read))[:3]}"
    # Nothing to do: said at once, no plan measured, no phase run.
    assert f"cache {cache} is complete: 36 samples at" in out and "[frames]" not in out and "plan for" not in out, out
    assert digests(cache) == before

    # The audit sees shard reads when there are some: --checksums all hashes every committed shard.
    out, read = audited_precompute(sample_dataset, cache, profile, tmp_path / "all.log", "--checksums", "all")
    n_shards = len(list((cache / frames_array(RESOLUTION)).rglob("c/*/0/0/0")))
    assert n_shards == 18 and len(read) == 2 * n_shards, sorted(map(str, read))
    assert digests(cache) == before
    # ... and says it did.
    assert (f"cache {cache} is complete: 36 samples at {RESOLUTION} (zarr), every shard committed and hashed "
            "(--checksums all: each matches its commit record); nothing to repair (--overwrite rebuilds it)") \
        in out.splitlines(), out


def test_a_resume_trusts_committed_shards_by_record_and_size_and_checksums_all_rewrites_a_flipped_one(
        sample_dataset: Path, profile: Path, cache: Path, reference: Path) -> None:
    damaged = shard_file(cache, feature_array(cache), 5)
    flip_byte(damaged)
    # The janus-cache precompute command, run in this process (the audit above runs it as one).
    command = ["precompute", sample_dataset, "--out", cache, "--profile", profile, "--workers", "1"]
    assert janus_cache_in_process(*command).returncode == 0
    assert digests(cache) != digests(reference), "the default resume trusts record + size: the flip stays"

    result = janus_cache_in_process(*command, "--checksums", "all")
    assert result.returncode == 0, result.stderr
    assert "[features] 36 samples, 34 already done" in result.stderr, result.stderr  # the 2 of shard 5 redone
    assert digests(cache) == digests(reference)

    # A shard whose size differs from its record is rewritten by the default resume.
    truncated = shard_file(cache, frames_array(RESOLUTION), 3)
    truncated.write_bytes(truncated.read_bytes()[:-1])
    result = janus_cache_in_process(*command)
    assert result.returncode == 0, result.stderr
    assert "[frames] 36 frames, 34 already done" in result.stderr, result.stderr
    assert digests(cache) == digests(reference)

    # So is a shard whose commit record is damaged (not JSON): it proves nothing.
    CacheLayout(cache).commit_record(feature_array(cache), 7).write_text("{not json")
    result = janus_cache_in_process(*command)
    assert result.returncode == 0, result.stderr
    assert "[features] 36 samples, 34 already done" in result.stderr, result.stderr
    assert digests(cache) == digests(reference)


def test_the_commit_tally_counts_rows_from_each_ranks_next_records(tmp_path: Path) -> None:
    """Progress counts committed rows by looking at each rank's next pending record only."""
    array, rows = "frames/x", [2, 2, 2, 1]
    shard_rows = [range(0, 2), range(2, 4), range(4, 6), range(6, 7)]
    looked: list[int] = []

    def committed(shard: int) -> bool:
        looked.append(shard)
        return read_record(tmp_path, array, shard) is not None

    def commit(shard: int) -> None:
        path = tmp_path / array / f"{shard}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * rows[shard])
        commit_shard(tmp_path, array, shard, shard_rows[shard], path)

    commit(0)  # committed by an earlier run: rank 0 still has 2 to do, rank 1 has 1 and 3
    tally = CommitTally(committed, rows, [[2], [1, 3]])
    assert tally() == 2 and sorted(looked) == [1, 2]
    commit(3)  # out of order: not counted before rank 1's shard 1
    assert tally() == 2
    commit(1)
    assert tally() == 5
    commit(2)
    looked.clear()
    assert tally() == 7 and tally() == 7 and looked == [2]


# ------------------------------------------------------------------------------------ verify


def test_the_sample_subset_is_one_shard_in_16_per_array_and_every_table() -> None:
    assert [s for s in range(40) if hashed("sample", "vggt/v/pad224", s, 40, seed=0)] == [0, 16, 32]
    assert [s for s in range(40) if hashed("sample", "vggt/v/pad224", s, 40, seed=3)] == [3, 19, 35]
    assert [s for s in range(5) if hashed("sample", "frames/pad224", s, 5, seed=7)] == [2]  # at least one
    assert all(hashed("sample", f"{TABLES_GROUP}/samples/key/utf8", 0, 1, seed=s) for s in range(SAMPLE_STRIDE))
    assert all(hashed("all", "frames/pad224", s, 18) for s in range(18))
    assert not any(hashed("none", array, 0, 1) for array in ("frames/pad224", f"{TABLES_GROUP}/frames/key"))
    with pytest.raises(ValueError, match="checksums must be one of all, sample, none"):
        hashed("some", "frames/pad224", 0, 1)


def test_a_flipped_payload_byte_is_found_by_all_by_sample_when_sampled_never_by_none(cache: Path, profile: Path) -> None:
    array = feature_array(cache)
    sampled, unsampled = 0, 5  # seed 0 hashes shards 0 and 16 of each array
    for shard in (sampled, unsampled):
        flip_byte(shard_file(cache, array, shard))

    every = check_integrity(cache, checksums="all", threads=3)
    assert every.failed and {b["shard"] for b in every.data["bad"]} == {f"{array}#0", f"{array}#5"}
    assert "fails its checksum" in every.problems[0] and str(shard_file(cache, array, 0).relative_to(cache)) in (
        every.problems[0])

    sample = check_integrity(cache, checksums="sample", seed=0)
    assert sample.failed and {b["shard"] for b in sample.data["bad"]} == {f"{array}#0"}
    assert check_integrity(cache, checksums="sample", seed=5).data["bad"][0]["shard"] == f"{array}#5"
    assert check_integrity(cache, checksums="sample", seed=1).passed

    none = check_integrity(cache, checksums="none")
    assert none.passed and none.data["hashed"] == 0
    # The trainer's start-up check is "none": cheap at any size; hashing is verify's job.
    assert all(r.passed for r in check_cache_for_training(cache, profile))


def test_the_trainers_start_up_check_reads_no_text_column(reference: Path, profile: Path, tmp_path: Path) -> None:
    """Schema, shard presence and freshness need no text: keys are decoded only to name a damaged
    shard, and the instruction/description columns never (they are most of a table's bytes)."""
    log = tmp_path / "gate.log"
    code = ("from janus_cache.verify import check_cache_for_training\n"
            f"assert all(r.passed for r in check_cache_for_training({str(reference)!r}, {str(profile)!r}))\n")
    result = run([sys.executable, AUDIT, str(log), "--", "python", "-c", code])
    assert result.returncode == 0, result.stderr
    opened = [Path(line) for line in log.read_text().splitlines()]
    tables = [p for p in opened if p.is_relative_to(reference / TABLES_GROUP) and p.is_file() and p.name != "zarr.json"]
    assert tables == [], tables
    assert any(p.is_relative_to(reference / "commits") for p in opened), "the audit saw the commit records read"


def test_hashing_shows_a_progress_bar_with_rate_and_eta(reference: Path, profile: Path) -> None:
    """On a terminal: tqdm's bar in bytes (rate, elapsed<remaining); in a log: lines with rate and ETA."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a terminal 160 wide
    try:
        proc = subprocess.run([JANUS_CACHE, "verify", str(reference), "--profile", str(profile), "--threads", "2"],
                              cwd=REPO_ROOT, env=env(), stdout=subprocess.PIPE, stderr=secondary, timeout=TIMEOUT,
                              check=False)
        os.close(secondary)
        terminal = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the pty is closed and drained
                break
            if not chunk:
                break
            terminal += chunk
    finally:
        os.close(primary)
    assert proc.returncode == 0, terminal.decode(errors="replace")[-3000:]
    assert re.search(rb"integrity: 100%\|.*\| [0-9.]+[kMG]?B?/[0-9.]+[kMG]?B? \[\d\d:\d\d<\d\d:\d\d, +[0-9.]+[kMG]?B/s\]",
                     terminal), terminal.decode(errors="replace")[-3000:]

    logged = run([JANUS_CACHE, "verify", str(reference), "--profile", str(profile), "--checksums", "all"])
    assert logged.returncode == 0, logged.stderr
    assert re.search(r"\[integrity\] [0-9.]+ [KMG]?B/[0-9.]+ [KMG]?B \(100%\) [0-9.]+ [KMG]?B/s, ETA 0s", logged.stderr), \
        logged.stderr


# ------------------------------------------------------------------------------------ full disk


def _namespaces_work() -> bool:
    probe = run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                 "mount -t tmpfs -o size=64k tmpfs /mnt && test -d /mnt"]) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs unprivileged user+mount namespaces (unshare -rm) for a tmpfs")
def test_a_full_disk_ends_two_ranks_with_one_line_and_the_same_command_then_finishes_the_cache(
        sample_dataset: Path, profile: Path, reference: Path, tmp_path: Path) -> None:
    """The cache directory is a tmpfs of ~half the cache's size, in a namespace of the test's own:
    the writes hit the kernel's ENOSPC. ``--force`` starts although the plan does not fit."""
    size = sum(p.stat().st_size for p in reference.rglob("*") if p.is_file())
    limit = (size // 2 // 4096) * 4096
    mount, kept = tmp_path / "small-disk", tmp_path / "kept"
    mount.mkdir()
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              "-m", "pipelines.precompute", str(sample_dataset), "--out", str(mount / "cache"), "--profile",
              str(profile), "--workers", "1", "--force"]
    script = (f"mount -t tmpfs -o size={limit} tmpfs {mount} && {' '.join(launch)}; code=$?; "
              f"cp -a {mount}/cache {kept}; exit $code")
    result = run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script])
    ranks_output = result.stdout + result.stderr
    assert result.returncode != 0, ranks_output[-3000:]
    errors = [line for line in ranks_output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, ranks_output[-5000:]
    assert re.search(r"no room left writing .*\(No space left on device\): the disk has [0-9.]+ [KMG]?B free and the "
                     r"cache holds [0-9.]+ [KMG]?B of the [0-9.]+ [KMG]?B planned; free space and run the same command "
                     "again", errors[0]), errors[0]
    assert "0.0 GB" not in errors[0]
    assert "gloo" not in ranks_output.lower() and not re.search(r'pipelines/precompute\w*\.py", line', ranks_output), (
        ranks_output)

    # Room again (the cache moved to a disk with space): the same command finishes it.
    resumed = run([JANUS_CACHE, "precompute", str(sample_dataset), "--out", str(kept), "--profile", str(profile),
                   "--workers", "1"])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert digests(kept) == digests(reference)


def test_a_slow_phase_logs_its_rate_with_a_decimal(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A log line of a phase doing under one unit per second reads e.g. 0.5/s, never 0/s."""
    from pipelines.distributed import Progress

    clock = iter([0.0, 4.0])
    monkeypatch.setattr("pipelines.distributed.time.perf_counter", lambda: next(clock))
    progress = Progress(enabled=True, log_every=0.0)
    progress.tty = False
    progress.phase("features", 10, "samples")
    progress.update(2)
    assert "[features] 2/10 (20%) 0.5/s, ETA 16s" in capsys.readouterr().err
