"""The installed ``janus-cache`` command: ``sample-data`` then ``index`` as processes. (The other
commands' exit codes and one-line reasons, in process: tests/unit/test_cli.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def janus_cache(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "janus-cache"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)


def test_sample_data_then_index_through_the_installed_command(tmp_path: Path) -> None:
    data = tmp_path / "data"
    made = janus_cache("sample-data", str(data), "--episodes", "2", "--steps", "11", "--seed", "3")
    assert made.returncode == 0, made.stderr
    shown = janus_cache("index", str(data), "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["episodes"] == 2
    assert summary["frames"] == 22
    assert summary["samples"] == 22
    assert summary["images_per_sample"] == 9
