"""Session fixtures: precomputed caches built once per test session and shared (read-only).

A test that damages, appends to or repairs a cache copies it first (``shutil.copytree``). Each cache
is built on first use, in this process (the precompute entry point a ``janus-cache precompute``
process runs, without the process start): the tests that need the command itself, or several
processes, start those runs themselves and compare them with these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.built_once import build_once, shared_folder
from helpers.profiles import write_test_profile

SMALL_SHARDS = {"frames_per_shard": 4, "samples_per_shard": 2}
"""The sample dataset's 36 frames and 36 samples cut into 9 frame shards and 18 sample shards:
shards spread over both ranks of a 2-process run, and a run can be stopped between two commits."""


def build_cache(data: Path | str | tuple[str | Path, ...], out: Path, profile: Path, cache_format: str = "zarr",
                ) -> Path:
    """``janus-cache precompute DATA --out OUT --profile PROFILE --format F --workers 1`` in this process."""
    from pipelines.precompute_run import Options, run

    code = run(Options(data, out, profile=str(profile), cache_format=cache_format, workers=1))
    assert code == 0, f"the precompute of {out} exited {code}"
    return out


@pytest.fixture(scope="session")
def small_shards_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile with SMALL_SHARDS."""
    return build_once(shared_folder(tmp_path_factory, "small-shards") / "small-shards.yaml",
                      lambda path: write_test_profile(path, cache=SMALL_SHARDS))


@pytest.fixture(scope="session")
def small_shards_cache(sample_dataset: Path, small_shards_profile: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The cache of ``sample_dataset`` with ``small_shards_profile`` in a format (``zarr``, ``wds``),
    built uninterrupted on first use. Read-only: copy it to change it."""
    built: dict[str, Path] = {}

    def cache(cache_format: str) -> Path:
        if cache_format not in built:
            out = shared_folder(tmp_path_factory, f"small-shards-{cache_format}") / "cache"
            built[cache_format] = build_once(
                out, lambda out: build_cache(sample_dataset, out, small_shards_profile, cache_format))
        return built[cache_format]

    return cache


# ------------------------------------------------------------------------- several sources


@pytest.fixture(scope="session")
def source_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile with 4 rows per shard: the 10 frames and samples of source A end in a
    partially filled shard (rows 8-9), which an append must rewrite."""
    from helpers.sources import ROWS_PER_SHARD

    return build_once(shared_folder(tmp_path_factory, "profiles") / "sources.yaml",
                      lambda path: write_test_profile(path, cache={"frames_per_shard": ROWS_PER_SHARD,
                                                                   "samples_per_shard": ROWS_PER_SHARD}))


@pytest.fixture(scope="session")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two small datasets (read-only; copy to change one): A with 2 episodes, B with 1, 5 frames each.
    Both name their episodes ``episode_0000``...: only the source name keeps their keys apart."""
    from helpers.sources import STEPS
    from janus_core.sample_data import write_sample_data

    root = shared_folder(tmp_path_factory, "sources")
    return (build_once(root / "A", lambda out: write_sample_data(out, episodes=2, steps=STEPS, seed=0)),
            build_once(root / "B", lambda out: write_sample_data(out, episodes=1, steps=STEPS, seed=1)))


@pytest.fixture(scope="session")
def source_caches(sources: tuple[Path, Path], source_profile: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Callable[[str, str], Path]:
    """``source_caches(format, which)``: the cache of A alone named ``r2r`` (``which="a"``) or of A
    and B named ``r2r`` and ``d1`` (``"ab"``), with ``source_profile``, built from scratch on first
    use. Read-only: copy one to append to it or change it."""
    a, b = sources
    named = {"a": (f"r2r={a}",), "ab": (f"r2r={a}", f"d1={b}")}
    built: dict[tuple[str, str], Path] = {}

    def cache(cache_format: str, which: str) -> Path:
        if (cache_format, which) not in built:
            out = shared_folder(tmp_path_factory, f"sources-{cache_format}-{which}") / "cache"
            built[cache_format, which] = build_once(
                out, lambda out: build_cache(named[which], out, source_profile, cache_format))
        return built[cache_format, which]

    return cache


# ------------------------------------------------------------------------------------ verify


@dataclass(frozen=True)
class VerifyCaches:
    data: Path
    zarr: Path
    wds: Path
    failed: str
    """The sample whose window frame could not be decoded at precompute (listed in report.json)."""


def step_of(frame: Path) -> int:
    """The step of a sample-data file (``step_0007_FORWARD.png`` -> 7)."""
    return int(frame.name.split("_")[1])


def failing_episode(data: Path) -> Path:
    """The episode of ``verify_caches``'s data whose last frame cannot be made into a frame."""
    return sorted(p for p in data.iterdir() if p.is_dir())[1]


@pytest.fixture(scope="session")
def verify_caches(tmp_path_factory: pytest.TempPathFactory) -> VerifyCaches:
    """A small dataset (2 episodes x 10 frames: padded and linspace windows) and its caches in both
    formats (tiny profile), one sample of which failed at precompute. Read-only: copy to damage."""
    import json

    from PIL import Image

    from janus_core.sample_data import write_sample_data
    from pipelines.precompute_run import Options, run

    def build(root: Path) -> None:
        data = write_sample_data(root / "data", episodes=2, steps=10, seed=0)
        # As in real data, one source cannot be made into a frame: a valid image too elongated for
        # any resolution. Its sample fails at precompute and is reported, which verify must accept.
        last = max(failing_episode(data).glob("step_*.png"), key=step_of)
        Image.new("RGB", (2000, 10), (90, 90, 90)).save(last)
        for fmt in ("zarr", "wds"):
            assert run(Options(data, root / fmt, cache_format=fmt, workers=1, allow_failures=1)) == 0

    root = build_once(shared_folder(tmp_path_factory, "verify") / "caches", build)
    data = root / "data"
    episode = failing_episode(data)
    failed = f"{episode.name}/{max(step_of(p) for p in episode.glob('step_*.png'))}"
    assert list(json.loads((root / "zarr" / "report.json").read_text())["failed_samples"]) == [failed]
    return VerifyCaches(data, root / "zarr", root / "wds", failed)
