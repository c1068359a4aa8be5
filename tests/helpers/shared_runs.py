"""Session fixtures: finished training runs (and the checkpoint directories runs start from) built
once per test session and shared (read-only).

A test that resumes, damages or exports into a run copies it first (``shutil.copytree``).

The training data of the stage-2 tests: 2 episodes x 4 steps of sample data = 8 samples, cached
twice by the in-process precompute: with float32 features (the reference run trains on it, so a
live recomputation can be held to it tightly) and with the tiny profile's default bfloat16.

The reference run (one real torchrun launch of 2 processes): micro-batch 1, gradient accumulation
2, so one optimizer step takes 4 samples and an epoch is 2 steps; 10 steps with a checkpoint every
3 (tags 3, 6, 9 and the final 10; step 3 ends mid-epoch), a live check every 5, the final model's
outputs recorded on two samples, and the end-of-run export.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from helpers.built_once import build_once, shared_folder
from helpers.training import assert_succeeded, precompute, read_metrics, torchrun_train, write_train_profile
from janus_core.profile import Profile, load_profile
from janus_core.sample_data import write_sample_data
from janus_train.config import TrainSettings, load_train_settings

if TYPE_CHECKING:
    from janus_train.model.janus_model import JanusVLNModel

EPISODES, STEPS = 2, 4  # 8 samples
RECORDED_SAMPLES = 2


class TinyTraining:
    """The sample data and its two caches, each with the profile it was made with; each cache is
    precomputed on first use, so a test session that needs one does not pay for the other."""

    def __init__(self, root: Path, episodes: int = EPISODES) -> None:
        self.root = root
        self.data = build_once(root / "data",
                               lambda data: write_sample_data(data, episodes=episodes, steps=STEPS, seed=0))
        self.fp32_profile = build_once(root / "fp32.yaml", lambda path: write_train_profile(
            path, cache={"feature_dtype": "float32"}))
        self.bf16_profile = build_once(root / "bf16.yaml", write_train_profile)

    @cached_property
    def fp32_cache(self) -> Path:
        return build_once(self.root / "cache-fp32", lambda out: precompute(self.data, out, self.fp32_profile))

    @cached_property
    def bf16_cache(self) -> Path:
        return build_once(self.root / "cache-bf16", lambda out: precompute(self.data, out, self.bf16_profile))

    def profile(self, features: str = "float32") -> Profile:
        return load_profile(self.fp32_profile if features == "float32" else self.bf16_profile)

    def settings(self, features: str = "float32") -> TrainSettings:
        return load_train_settings(self.profile(features))

    def model(self, features: str = "float32", live: bool = False) -> JanusVLNModel:
        """The model every rank of a run starts from (same seeds), in this process."""
        from janus_train.model.janus_model import JanusVLNModel

        return JanusVLNModel.from_profile(self.profile(features), self.settings(features).model_config(), live=live,
                                          device="cpu")


@dataclass(frozen=True)
class ReferenceRun:
    """A finished run: its directory, its metrics records, its recorded outputs and its console."""

    out: Path
    records: list[dict[str, Any]]
    outputs: Path
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return (self.stdout + self.stderr).splitlines()


@pytest.fixture(scope="session")
def tiny_training(tmp_path_factory: pytest.TempPathFactory) -> TinyTraining:
    """The 8-sample data, precomputed into a float32 and a bfloat16 zarr cache. Read-only."""
    return TinyTraining(shared_folder(tmp_path_factory, "tiny-training"))


@pytest.fixture(scope="session")
def three_episodes(tmp_path_factory: pytest.TempPathFactory) -> TinyTraining:
    """The same with 3 episodes x 4 steps (12 samples: 3 optimizer steps of 4 per epoch). Read-only."""
    return TinyTraining(shared_folder(tmp_path_factory, "three-episodes"), episodes=3)


@pytest.fixture(scope="session")
def reference_run(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> ReferenceRun:
    """The reference run on the float32 cache (see the module's docstring). Read-only: copy it."""
    def train(root: Path) -> None:
        result = torchrun_train("--out", root / "run", "--cache", tiny_training.fp32_cache,
                                "--profile", tiny_training.fp32_profile,
                                "--record-outputs", root / "final_outputs.safetensors",
                                "--record-samples", RECORDED_SAMPLES)
        assert_succeeded(result)
        (root / "stdout.txt").write_text(result.stdout)
        (root / "stderr.txt").write_text(result.stderr)

    root = build_once(shared_folder(tmp_path_factory, "reference") / "reference", train)
    return ReferenceRun(root / "run", read_metrics(root / "run"), root / "final_outputs.safetensors",
                        (root / "stdout.txt").read_text(), (root / "stderr.txt").read_text())


@dataclass(frozen=True)
class TinyRun:
    profile: Path
    cache: Path
    run: Path


@pytest.fixture
def tiny_run(tiny_training: TinyTraining, reference_run: ReferenceRun) -> TinyRun:
    """The reference run (ZeRO-3, torchrun, 2 processes, checkpoints up to its last step) with the
    profile and cache it was made with. Read-only: export it elsewhere."""
    return TinyRun(tiny_training.fp32_profile, tiny_training.fp32_cache, reference_run.out)


@pytest.fixture(scope="session")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference JanusVLN checkpoint directory at the tiny sizes (helpers.reference). Read-only."""
    from helpers.reference import write_reference_dir

    return write_reference_dir(tmp_path_factory.mktemp("reference-dir") / "janusvln")


@pytest.fixture(scope="session")
def reference_dir_with_heads(reference_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``reference_dir`` plus VGGT's depth and point heads, as the reference trainer saves it. Read-only."""
    import torch
    from safetensors.torch import load_file

    from helpers.reference import vggt_head_shapes, write_reference_dir

    generator = torch.Generator().manual_seed(2)
    heads = {key: 0.05 * torch.randn(shape, generator=generator) for key, shape in vggt_head_shapes().items()}
    return write_reference_dir(tmp_path_factory.mktemp("reference-dir") / "janusvln-heads",
                               load_file(reference_dir / "model.safetensors") | heads)


class OneSampleShards:
    """Intact zarr caches of 2 episodes x 4 steps with one sample per feature shard (the damage tests'
    profile, helpers.damage): ``cache("a")`` of the sample data of seed 0, ``cache("b")`` of seed 1,
    each precomputed on first use. Read-only: tests damage copies."""

    SEEDS = {"a": 0, "b": 1}

    def __init__(self, root: Path) -> None:
        from helpers.damage import write_profile

        self.root = root
        self.profile = build_once(root / "profile.yaml", write_profile)
        self._caches: dict[str, Path] = {}

    def data(self, name: str) -> Path:
        """The sample data of cache ``name`` (written with its cache)."""
        return self.root / f"data-{name}"

    def cache(self, name: str) -> Path:
        if name not in self._caches:
            data = build_once(self.data(name), lambda data: write_sample_data(
                data, episodes=EPISODES, steps=STEPS, seed=self.SEEDS[name]))
            self._caches[name] = build_once(self.root / name, lambda out: precompute(data, out, self.profile))
        return self._caches[name]


@pytest.fixture(scope="session")
def one_sample_shards(tmp_path_factory: pytest.TempPathFactory) -> OneSampleShards:
    return OneSampleShards(shared_folder(tmp_path_factory, "one-sample-shards"))
