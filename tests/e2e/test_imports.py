"""What a light command imports, checked by running it in a new process: the command line's help,
reading a profile (``janus-cache profile``, the Makefile's reads), the store package's manifest
and layout, and a training, precompute or plan start refused on its command line or profile need neither torch nor
transformers, the verify library none of the trainer and launch layer, and the console script's light commands start in under a CPU-second; a training start
imports DeepSpeed's Muon optimizer without the inductor compiler; a stage command's imports end
frozen for the garbage collector. Which module may import which is checked without running
anything, in ``tests/unit/test_import_layers.py``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.profiles import REPO_ROOT, write_test_profile

HEAVY = ("torch", "transformers", "deepspeed")
"""Packages that cost seconds to import: a light command must not need them."""

LIGHT_CPU_SECONDS = 1.0
"""The most CPU time (user + system) a light command of ``janus-cache`` may take."""


def fresh_interpreter(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python process on this tree's packages (not an installed copy)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


LOADED_HEAVY = f"""
import json, sys
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(json.dumps(heavy[:5]))
"""
"""Appended to a snippet: prints the heavy modules the snippet imported (the first few)."""


def test_janus_cache_help_imports_no_torch_nor_transformers() -> None:
    """``janus-cache --help`` lists every command (the stage commands too, by their docstrings)
    without importing a stage module, torch or transformers."""
    done = fresh_interpreter(
        "import sys\n"
        "from pipelines.cache_cli import app\n"
        "sys.argv = ['janus-cache', '--help']\n"
        "try:\n    app()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "assert 'pipelines.precompute' not in sys.modules and 'pipelines.verify' not in sys.modules\n"
        + LOADED_HEAVY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Precompute a cache of frozen-VGGT features and frames." in done.stdout
    assert "Check that a cache is complete, intact and current." in done.stdout
    assert " bench " in done.stdout and " info " in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_loading_a_profile_imports_no_torch_nor_transformers() -> None:
    """Reading a profile (what the Makefile does for nproc_per_node) and its validated train settings
    needs no deep-learning package."""
    done = fresh_interpreter(
        "import sys\n"
        "from janus_core.profile import load_profile\n"
        "from janus_train.config import load_train_settings\n"
        "profile = load_profile(sys.argv[1])\n"
        "assert profile.nproc_per_node == 2 and profile.cache.reference_frame == 'last', profile\n"
        "settings = load_train_settings(profile)\n"
        "assert settings.model_config().trainable.vggt_merger and not settings.loss_config().ramps\n"
        + LOADED_HEAVY, "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_janus_cache_profile_imports_no_torch_nor_transformers() -> None:
    """``janus-cache profile tiny`` prints the resolved profile, train settings included, without
    importing torch or transformers."""
    done = fresh_interpreter(
        "import sys\n"
        "from pipelines.cache_cli import app\n"
        "sys.argv = ['janus-cache', 'profile', 'tiny']\n"
        "try:\n    app()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        + LOADED_HEAVY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "profile tiny" in done.stdout and "train: micro-batch 1" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_store_package_imports_torch_only_with_its_readers_and_writers() -> None:
    """``janus_cache.store`` gives its manifest, layout and commit records without torch; torch comes
    with the first reader or writer asked for, the same class as its module's."""
    done = fresh_interpreter(
        "import sys\n"
        "import janus_cache.store as store\n"
        "assert store.Manifest and store.CacheLayout and store.read_manifest and store.StoreError\n"
        + LOADED_HEAVY +
        "from janus_cache.store import ZarrCacheReader\n"
        "from janus_cache.store.zarr_store import ZarrCacheReader as Direct\n"
        "assert ZarrCacheReader is Direct and 'torch' in sys.modules\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_verify_library_imports_neither_the_trainer_nor_the_launch_layer() -> None:
    """The verify library stays a layer of its own, whatever it imports at run time (the training
    gate itself, in process: tests/unit/test_verify_gate.py)."""
    done = fresh_interpreter("import sys, janus_cache.verify\n"
                             "print(sorted({m.split('.')[0] for m in sys.modules} & {'janus_train', 'pipelines'}))")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [["--help"], ["profile", "tiny"], ["bench", "--help"]],
                         ids=["--help", "profile tiny", "bench --help"])
def test_a_light_command_costs_at_most_one_cpu_second(args: list[str]) -> None:
    """The console script itself, in a new process: user + system CPU time (not wall time, which
    a loaded machine stretches) of ``janus-cache --help``, ``janus-cache profile tiny`` and
    ``janus-cache bench --help`` (the benchmark's own program, which imports its run only when it
    runs) stays within a second."""
    script = Path(sys.executable).parent / "janus-cache"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([str(script), *args], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    command = " ".join(["janus-cache", *args])
    assert cpu <= LIGHT_CPU_SECONDS, f"{command} took {cpu:.2f} CPU-s (at most {LIGHT_CPU_SECONDS})"


TRAIN_START = """
import sys
from pipelines.train import main
sys.argv = ['pipelines.train', *sys.argv[1:]]
try:
    main()
except SystemExit as exit:
    print(f"exit {exit.code}")
""" + LOADED_HEAVY
"""Runs ``python -m pipelines.train ARGS`` as one rank of one, then prints the exit code and the
heavy modules loaded."""


def test_the_training_commands_help_imports_no_torch_nor_transformers() -> None:
    """``pipelines.train --help`` (what ``janus-train run --help-train`` shows) lists the options
    without loading the run's half."""
    done = fresh_interpreter(TRAIN_START + "assert 'pipelines.train_run' not in sys.modules\n", "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--cache" in done.stdout and "--live-data" in done.stdout and "exit 0" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("mistake", ["a bad setting", "a run directory that is a file", "no cache yet"])
def test_a_training_start_refused_on_its_command_line_or_profile_loads_no_torch(tmp_path: Path, mistake: str) -> None:
    """The mistakes a user makes first are one ``error:`` line (exit code 1) before torch,
    transformers or DeepSpeed load: a second per rank instead of several."""
    cache, out = tmp_path / "cache", tmp_path / "run"
    cache.mkdir()
    overrides = ["--set", "train.num_workers=-1"] if mistake == "a bad setting" else []
    if mistake == "a run directory that is a file":
        out.write_text("not a directory")
    if mistake == "no cache yet":
        cache.rmdir()
    done = fresh_interpreter(TRAIN_START, "--out", str(out), "--cache", str(cache), "--profile",
                             str(write_test_profile(tmp_path / "tiny.yaml")), *overrides)
    expected = {"a bad setting": "setting 'train.num_workers' is -1; it must be >= 0",
                "a run directory that is a file": f"{out} is not a directory",
                "no cache yet": f"no cache exists at {cache}: make one with `make precompute"}[mistake]
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("error: ")] == [
        line for line in done.stderr.splitlines() if expected in line], done.stderr
    assert expected in done.stderr and "exit 1" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert not out.is_dir(), "a refused start leaves no run directory behind"


PRECOMPUTE_START = TRAIN_START.replace("pipelines.train", "pipelines.precompute")
"""Runs ``python -m pipelines.precompute ARGS`` as one rank of one, then prints the exit code and
the heavy modules loaded."""


@pytest.mark.parametrize("mistake, code, expected", [
    ("--resolution=pad13", 2, "--resolution: resolution 'pad13': resolution target must be a positive multiple"),
    ("--set=cache.history=0", 1, "setting 'cache.history' is 0; it must be >= 1"),
])
def test_a_precompute_start_refused_on_its_command_line_or_profile_loads_no_torch(
        tmp_path: Path, mistake: str, code: int, expected: str) -> None:
    """A bad resolution or setting is one ``error:`` line before torch loads, and nothing is written."""
    data = tmp_path / "data"
    data.mkdir()
    done = fresh_interpreter(PRECOMPUTE_START, str(data), "--out", str(tmp_path / "cache"), "--profile",
                             str(write_test_profile(tmp_path / "tiny.yaml")), mistake)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], done.stderr
    assert f"exit {code}" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert not (tmp_path / "cache").exists()


def test_a_plan_refused_on_its_resolution_loads_no_torch(tmp_path: Path) -> None:
    """``janus-cache plan`` reads the profile and the resolution before it loads the encoders."""
    done = fresh_interpreter(
        "import sys\n"
        "from pipelines.cache_cli import app\n"
        "sys.argv = ['janus-cache', 'plan', *sys.argv[1:]]\n"
        "try:\n    app()\nexcept SystemExit as exit:\n    print(f'exit {exit.code}')\n"
        + LOADED_HEAVY, str(tmp_path), "--resolution", "pad13")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.startswith("error: resolution 'pad13': ") and "exit 1" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_an_export_refused_on_its_profile_loads_no_torch(tmp_path: Path) -> None:
    """``janus-train export`` checks the profile before it loads the model code."""
    done = fresh_interpreter(
        "import sys\n"
        "from pipelines.train_cli import app\n"
        "sys.argv = ['janus-train', 'export', *sys.argv[1:]]\n"
        "try:\n    app()\nexcept SystemExit as exit:\n    print(f'exit {exit.code}')\n"
        + LOADED_HEAVY, str(tmp_path / "run"), "--out", str(tmp_path / "export"), "--profile", "no-such-profile")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.startswith("error: unknown profile 'no-such-profile'") and "exit 1" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert not (tmp_path / "export").exists()


def test_a_training_start_imports_deepspeeds_muon_with_its_compilation_left_to_a_first_call() -> None:
    """``deepspeed.initialize`` imports DeepSpeed's Muon optimizer (ZeRO's optimizer check), whose
    import wraps functions in ``torch.compile`` and so imports the inductor compiler (1.2 CPU-seconds
    on every rank). The engine's builder imports it first with each function compiled on its first
    call: no inductor at start, DeepSpeed's own decorator restored, and a called function compiled once."""
    done = fresh_interpreter(
        "import sys\n"
        "import torch\n"
        "from janus_train.build import MUON_MODULE, import_muon_uncompiled\n"
        "import_muon_uncompiled()\n"
        "assert MUON_MODULE in sys.modules\n"
        "assert 'torch._inductor.compile_fx' not in sys.modules, 'the inductor compiler was imported'\n"
        "from deepspeed.runtime import compiler\n"
        "from deepspeed.runtime.zero.muon.original_muon import zeropower_via_newtonschulz5 as newton_schulz\n"
        "assert compiler.compile() is torch.compile\n"
        "compiled = []\n"
        "torch.compile = lambda function: compiled.append(function) or function\n"
        "for _ in range(2):\n"
        "    newton_schulz(torch.eye(4), steps=1)\n"
        "assert compiled == [newton_schulz.__wrapped__], compiled\n"
        "print('ok')")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok"


def test_a_stage_commands_imports_end_frozen_with_the_collector_on() -> None:
    """``janus-cache`` loads a stage command (verify: torch and the cache checks) with the collector
    paused, and what the load made is frozen: the collector is on, and its full collections walk
    only what the command makes from then on (pipelines.frozen_imports)."""
    done = fresh_interpreter(
        "import gc, sys\n"
        "from pipelines.cache_cli import STAGE_COMMANDS\n"
        "STAGE_COMMANDS['verify'].load()\n"
        "assert 'torch' in sys.modules\n"
        "print(gc.isenabled(), gc.get_freeze_count(), len(gc.get_objects()))")
    assert done.returncode == 0, done.stderr[-3000:]
    enabled, frozen, tracked = done.stdout.split()
    assert enabled == "True"
    assert int(frozen) > 100_000 and int(tracked) < 1_000, (frozen, tracked)
