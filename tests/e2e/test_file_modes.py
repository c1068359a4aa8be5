"""Files a user trusts: what ``janus-train export`` writes gets the user's umask,
as every other file janus writes, so others on a shared cluster can read an exported model.
safetensors writes its files 0600; the export gives them (and every other file it wrote) the mode
a plain ``open()`` gives under the umask: 0644 under 022, 0640 under 027.

Real ``janus-train export`` processes on the session's ZeRO-3 tiny reference run (helpers.shared_runs).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from helpers.profiles import REPO_ROOT
from helpers.first_use import JANUS_TRAIN
from helpers.shared_runs import TinyRun


@pytest.mark.parametrize(("fmt", "umask", "mode"), [("janus", 0o022, 0o644), ("janusvln", 0o027, 0o640)])
def test_every_exported_file_gets_the_users_umask(tiny_run: TinyRun, tmp_path: Path, fmt: str, umask: int,
                                                  mode: int) -> None:
    out = tmp_path / "export"
    result = subprocess.run([str(JANUS_TRAIN), "export", str(tiny_run.run), "--out", str(out), "--profile",
                             str(tiny_run.profile), "--format", fmt], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: os.umask(umask))
    assert result.returncode == 0, result.stderr[-3000:]
    modes = {p.relative_to(out).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in out.rglob("*") if p.is_file()}
    assert any(name.endswith(".safetensors") for name in modes), modes
    assert modes == dict.fromkeys(modes, oct(mode))
