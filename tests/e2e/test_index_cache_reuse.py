"""A precompute (2 processes, started as torchrun starts them: helpers.forked_ranks), its resume and
``janus-cache verify`` reuse the dataset index kept in the cache. (The index store itself, in process:
tests/unit/test_index_cache.py.)"""

from __future__ import annotations

import os
from pathlib import Path

from helpers.dataset_files import age, images, scramble_keeping_size_and_mtime
from helpers.forked_ranks import forked_launch
from janus_core.index.cached import COMBINED_PREFIX


def test_precompute_resume_and_verify_reuse_the_index_kept_in_the_cache(tmp_path: Path) -> None:
    """Two ranks: the first run indexes (past the folder a run killed while storing its index left;
    rank 1 reads the stored columns), a resume and an ``--overwrite`` run reuse the index, and so
    does ``verify --data``, without opening an image (scrambled behind its back, same size and
    mtime: trusted, as documented)."""
    import subprocess
    import sys

    from helpers.profiles import REPO_ROOT, write_test_profile
    from janus_cache.store.layout import CacheLayout
    from janus_core.sample_data import write_sample_data

    data = write_sample_data(tmp_path / "data", episodes=2, steps=10, seed=1)
    age(data)
    profile = write_test_profile(tmp_path / "profile.yaml", cache={"resolution": "pad112"})
    cache = tmp_path / "cache"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    precompute = [data, "--out", cache, "--profile", profile, "--workers", "1"]

    def output(done: subprocess.CompletedProcess[str]) -> str:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    def run(command: list[str]) -> str:
        return output(subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
                                     check=False))

    def run_precompute(*extra: str) -> str:
        return output(forked_launch("pipelines.precompute", *precompute, *extra, timeout=900))

    # What a precompute killed while storing its index leaves, the whole of OUT then: a half-written
    # entry's folder. The rerun runs (it once failed: "[Errno 21] Is a directory") and removes it.
    leftover = CacheLayout(cache).index_store / ".sources-0123456789abcdef0123.4242.partial"
    (leftover / "columns").mkdir(parents=True)
    (leftover / "columns" / "frames.npy").write_bytes(b"half")
    assert "20 images read and hashed" in run_precompute()
    assert not leftover.exists()
    stored = sorted(os.listdir(CacheLayout(cache).index_store))  # the source's entry and the job's combined one
    assert len(stored) == 2 and stored[1].startswith(COMBINED_PREFIX)
    assert "reused the stored index" in run_precompute()
    assert "reused the stored index" in run_precompute("--overwrite")  # the index outlives the cache
    scramble_keeping_size_and_mtime(images(data))
    verify = [str(Path(sys.executable).parent / "janus-cache"), "verify", str(cache), "--data", str(data),
              "--profile", str(profile), "--live", "0"]
    assert "verify passed" in run(verify)  # no image opened: their sizes and mtimes are unchanged
    assert sorted(os.listdir(CacheLayout(cache).index_store)) == stored
