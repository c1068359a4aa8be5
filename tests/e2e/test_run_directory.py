"""A run directory describes itself, and a profile changes without copying YAML.

One 2-process ZeRO-3 training run (tiny models, CPU) with a profile that ``extends: tiny`` from
another folder and changes the model (merger width, lam, prompt template), given further
``--set`` overrides; then the same command resumes it for one more step without ``--profile``.
What the run directory must then hold, and what the public commands read from it:

* ``profile.yaml``: every setting, resolved (the parent's, the child's and the ``--set``'s), which
  loads back as ``--profile`` into the same settings;
* ``run.json``: one entry per start with the command line, janus's version and git commit, the
  package versions and the sha256 of the cache's manifest;
* ``train.log``: every console line of rank 0, appended across the resume;
* ``metrics.jsonl``: every record with its wall-clock time (ISO 8601, UTC);
* ``janus-train export RUN`` with no ``--profile`` exports what the run trained (its own profile);
  an explicit ``--profile`` that disagrees on the model is one ``error:`` line;
* ``janus-train show-sample --run RUN`` shows the sample in the run's own prompt template.

The data and cache are the session's (helpers.shared_runs). When a recorded profile binds a run is
tests/unit/test_run_record.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open

from helpers.profiles import REPO_ROOT
from helpers.shared_runs import TinyTraining
from helpers.training import train_on_ranks
from janus_cache.store.layout import CacheLayout
from janus_core.index import build_index
from janus_core.profile import load_profile
from janus_train.checkpoint.export import HEADS_FILE
from janus_train.config import load_train_settings
from janus_train.run.layout import RunLayout

JANUS_TRAIN = str(Path(sys.executable).parent / "janus-train")
TIMEOUT_S = 600

# The child profile, in a folder of its own: tiny's models are found relative to tiny.yaml.
VARIANT = {
    "extends": "tiny",
    "train": {"merger_hidden": 64, "lam": 0.3, "prompt_template": "janus.yaml", "val_episodes": 0,
              "grad_accum": 2, "epochs": 100, "warmup_ratio": 0.0, "save_every": 2, "log_every": 1,
              "num_workers": 0},
}
OVERRIDES = ("train.max_steps=2", "train.lr_base=2e-3")


@dataclass(frozen=True)
class Trained:
    data: Path
    cache: Path
    profile: Path
    run: Path
    first: subprocess.CompletedProcess[str]
    resumed: subprocess.CompletedProcess[str]
    started: datetime
    ended: datetime


def janus_train(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([JANUS_TRAIN, *map(str, args)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


def succeeded(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def trained(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("rundir")
    profile = root / "profiles" / "variant.yaml"
    profile.parent.mkdir()
    profile.write_text(yaml.safe_dump(VARIANT))
    # The session's bfloat16 cache: the variant changes the model and training, not the cache settings.
    data, cache = tiny_training.data, tiny_training.bf16_cache
    out = root / "run"
    started = datetime.now(timezone.utc)
    first = succeeded(train_on_ranks("--out", out, "--cache", cache, "--profile", profile,
                                     *(f"--set={o}" for o in OVERRIDES)))
    # The same run continued for a step: no --profile, the run's own is read back.
    resumed = succeeded(train_on_ranks("--out", out, "--cache", cache, "--set", "train.max_steps=3", "--no-export"))
    return Trained(data, cache, profile, out, first, resumed, started, datetime.now(timezone.utc))


def test_the_run_directory_holds_its_description(trained: Trained) -> None:
    layout = RunLayout(trained.run)
    for path in (layout.profile, layout.run_file, layout.train_log, layout.metrics, layout.latest, layout.export):
        assert path.exists(), f"{path} is missing"


def test_profile_yaml_is_every_resolved_setting_and_loads_back_as_a_profile(trained: Trained) -> None:
    recorded = yaml.safe_load(RunLayout(trained.run).profile.read_text())
    train = recorded["train"]
    assert (train["merger_hidden"], train["lam"], train["prompt_template"]) == (64, 0.3, "janus.yaml")  # the child
    assert train["max_steps"] == 3 and train["lr_base"] == 2e-3  # the --set of the latest start and the first
    assert train["segment_weights"] == [1.0, 1.0, 1.0, 1.0] and train["zero_stage"] == 3  # tiny's and a default
    assert recorded["cache"]["resolution"] == "pad224" and recorded["name"] == "variant"
    assert Path(recorded["qwen"]["path"]) == REPO_ROOT / "configs" / "models" / "tiny-qwen2_5_vl"

    expected = load_profile(trained.profile, [*OVERRIDES, "train.max_steps=3"])
    again = load_profile(RunLayout(trained.run).profile)
    assert (again.cache, again.vggt, again.qwen, again.device, again.compute_dtype) == (
        expected.cache, expected.vggt, expected.qwen, expected.device, expected.compute_dtype)
    assert load_train_settings(again) == load_train_settings(expected)


def test_run_json_records_each_start_with_command_versions_and_cache_digest(trained: Trained) -> None:
    starts = json.loads(RunLayout(trained.run).run_file.read_text())["starts"]
    assert len(starts) == 2
    first, resumed = starts
    assert "--set=train.max_steps=2" in first["command"] and "pipelines.train" in first["command"]
    assert first["profile"]["overrides"] == list(OVERRIDES) and first["profile"]["file"] == str(trained.profile)
    assert resumed["profile"]["file"] == str(RunLayout(trained.run).profile)
    assert resumed["profile"]["overrides"] == ["train.max_steps=3"]
    manifest = hashlib.sha256(CacheLayout(trained.cache).manifest.read_bytes()).hexdigest()
    assert first["caches"] == [{"path": str(trained.cache.resolve()), "manifest_sha256": manifest}]
    import deepspeed
    import torch
    import transformers

    assert first["packages"]["torch"] == torch.__version__.split("+")[0] or first["packages"]["torch"] == torch.__version__
    assert first["packages"]["transformers"] == transformers.__version__
    assert first["packages"]["deepspeed"] == deepspeed.__version__
    assert first["janus"]["version"] and first["world"] == 2
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout
        assert first["janus"]["git_commit"] == head.stdout.strip()


def test_every_metrics_record_has_a_utc_wall_clock_time(trained: Trained) -> None:
    records = [json.loads(line) for line in RunLayout(trained.run).metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    times = [datetime.fromisoformat(r["time"]) for r in records]
    assert all(t.utcoffset() == timedelta(0) for t in times)
    assert trained.started <= times[0] <= times[1] <= times[2] <= trained.ended


def test_train_log_holds_rank_0s_console_across_the_resume(trained: Trained) -> None:
    log = RunLayout(trained.run).train_log.read_text().splitlines()
    printed = [line for result in (trained.first, trained.resumed) for line in result.stdout.splitlines()
               if line.startswith(("training ", "step ", "exported "))]
    assert len(printed) >= 6  # two start lines, three step lines, the export
    assert [line for line in log if line in printed] == printed
    assert any("resumed at step 2" in line for line in log)


def test_export_without_profile_uses_the_runs_own(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "export"
    result = succeeded(janus_train("export", trained.run, "--out", out, "--tag", "step00000002"))
    # One line, none of DeepSpeed's converter chatter (its accelerator warning, progress lines and bars).
    assert result.stdout.splitlines() == [f"exported {RunLayout(trained.run).checkpoints} to {out}"]
    assert result.stderr == ""
    with safe_open(str(out / HEADS_FILE), "pt") as exported, \
            safe_open(str(RunLayout(trained.run).export / HEADS_FILE), "pt") as at_end:
        assert exported.metadata()["lam"] == "0.3"
        assert set(exported.keys()) == set(at_end.keys())
        for key in exported.keys():  # the end-of-run export (step 2) and this one: the same weights
            assert exported.get_tensor(key).equal(at_end.get_tensor(key)), key
        assert any(64 in exported.get_tensor(key).shape for key in exported.keys() if "merger" in key)  # its width


def test_export_with_a_profile_that_disagrees_is_one_line(trained: Trained, tmp_path: Path) -> None:
    result = janus_train("export", trained.run, "--out", tmp_path / "export", "--profile", "tiny")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "train.lam is 0.2, the run's is 0.3" in lines[0] and "train.merger_hidden" in lines[0]
    assert str(RunLayout(trained.run).profile) in lines[0]
    assert not (tmp_path / "export").exists()


def test_show_sample_of_a_run_uses_its_prompt_template(trained: Trained) -> None:
    """The command with ``--run`` (a real process) prints what the same command (in this process)
    prints with the run's profile, and not what it prints with tiny's."""
    from typer.testing import CliRunner

    from pipelines.train_cli import app

    def in_process(*args: str | Path) -> str:
        result = CliRunner().invoke(app, ["show-sample", "--data", str(trained.data), "--key", key, *map(str, args)])
        assert result.exit_code == 0, result.output
        return result.stdout

    key = build_index(trained.data).samples[0].key
    shown = succeeded(janus_train("show-sample", "--data", trained.data, "--key", key, "--run", trained.run)).stdout
    variant, tiny = in_process("--profile", trained.profile), in_process("--profile", "tiny")
    assert shown == variant and shown != tiny


def test_a_resume_with_a_profile_that_disagrees_is_one_line_and_changes_nothing(trained: Trained) -> None:
    layout = RunLayout(trained.run)
    before = {path: path.read_bytes() for path in (layout.profile, layout.run_file, layout.metrics, layout.latest)}
    result = train_on_ranks("--out", trained.run, "--cache", trained.cache, "--profile", "tiny", "--no-export")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "train.merger_hidden is 128, the run's is 64" in errors[0], result.stderr[-3000:]
    assert {path: path.read_bytes() for path in before} == before


def edited_copy(trained: Trained, target: Path, **train: object) -> Path:
    """A copy of the run whose ``profile.yaml`` a user edited (``train`` settings changed)."""
    run = Path(shutil.copytree(trained.run, target))
    profile = RunLayout(run).profile
    data = yaml.safe_load(profile.read_text())
    data["train"].update(train)
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    return run


def test_an_edited_profile_yaml_is_refused_where_it_changes_the_model_and_noted_otherwise(
        trained: Trained, tmp_path: Path) -> None:
    """``RUN/profile.yaml`` edited after the last start (which ``run.json`` records): a changed
    model setting is refused by a resume and an export in one line naming the file, the setting and
    both values; another changed setting is said in one ``note:`` line (before: both were used
    silently)."""
    run = edited_copy(trained, tmp_path / "lam", lam=0.5)
    expected = (f"error: {RunLayout(run).profile} was edited after the run's last start (run.json records its "
                f"settings): train.lam is 0.5, the run's was 0.3; these settings shape the run's checkpoints: "
                "restore them, or train into a new --out")
    exported = janus_train("export", run, "--out", tmp_path / "export")
    assert (exported.returncode, exported.stderr.strip()) == (1, expected), exported.stderr
    before = {path: path.read_bytes() for path in (RunLayout(run).run_file, RunLayout(run).metrics)}
    resumed = train_on_ranks("--out", run, "--cache", trained.cache, "--no-export")
    assert resumed.returncode != 0
    assert [line for line in resumed.stderr.splitlines() if line.startswith("error: ")] == [expected], resumed.stderr
    assert {path: path.read_bytes() for path in before} == before

    run = edited_copy(trained, tmp_path / "save-every", save_every=5)
    exported = succeeded(janus_train("export", run, "--out", tmp_path / "export", "--tag", "step00000002"))
    assert exported.stderr.strip() == (f"note: {RunLayout(run).profile} was edited after the run's last start: "
                                       "train.save_every is 5, the run's was 2; the file's values are used")


def test_a_damaged_run_json_is_kept_aside_and_said(trained: Trained, tmp_path: Path) -> None:
    """A ``run.json`` that is not JSON: the next start keeps it aside, says so in one line, and
    begins a new record (before: it was replaced without a word)."""
    run = Path(shutil.copytree(trained.run, tmp_path / "run"))
    layout = RunLayout(run)
    layout.run_file.write_text('{"starts": [{"time": "2026-')
    resumed = succeeded(train_on_ranks("--out", run, "--cache", trained.cache, "--no-export"))
    warnings = [line for line in resumed.stderr.splitlines() if line.startswith("warning: ")]
    aside = [path for path in run.iterdir() if path.name.startswith("run.json.damaged-")]
    assert len(aside) == 1 and aside[0].read_text() == '{"starts": [{"time": "2026-'
    assert len(warnings) == 1 and re.fullmatch(
        rf"warning: {re.escape(str(layout.run_file))} could not be read \(JSONDecodeError: .+\); kept it as "
        rf"{re.escape(str(aside[0]))} and began a new record with this start", warnings[0]), resumed.stderr
    assert len(json.loads(layout.run_file.read_text())["starts"]) == 1


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder where no file can be written: inside a read-only (0555) one, or for root, whom file
    permissions do not stop, in /sys (sysfs takes no new files)."""
    if os.geteuid() != 0:
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
        return read_only / "export"
    return Path("/sys/janus-export")


def test_an_export_to_a_folder_it_cannot_write_or_of_a_tag_the_run_lacks_is_one_line(
        trained: Trained, tmp_path: Path) -> None:
    """``janus-train export RUN --out <read-only>`` and ``--tag step99999999``: one ``error:`` line
    each, before any checkpoint is read, naming the folder and the kernel's reason, or the tags the
    run holds (before: a traceback of 46 and 56 lines)."""
    out = unwritable_folder(tmp_path)
    refused = janus_train("export", trained.run, "--out", out)
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    assert re.fullmatch(rf"error: --out {re.escape(str(out))} cannot be written \((Permission denied|Operation not "
                        r"permitted|Read-only file system)\): give a folder you can write to \(the checkpoints are "
                        r"unchanged\)", refused.stderr.strip()), refused.stderr
    refused = janus_train("export", trained.run, "--out", tmp_path / "export", "--tag", "step99999999")
    checkpoints = RunLayout(trained.run).checkpoints
    tags = ", ".join(f"step{step:08d}" for step in (3, 2))
    assert (refused.returncode, refused.stderr.strip()) == (1, (
        f"error: {checkpoints} holds no checkpoint 'step99999999' (its tags: {tags}); give one of them with --tag, "
        "or leave --tag out")), refused.stderr
