"""``make ... SET="a=1 b=2"`` passes each word as one ``--set`` to every profile command (``make -n``).
(``--set`` and ``extends`` themselves, in process: tests/unit/test_profile_overrides.py.)"""

from __future__ import annotations

import subprocess

from helpers.profiles import REPO_ROOT


def test_make_passes_set_to_every_profile_command() -> None:
    """``make … SET="a=1 b=2"``: each word one ``--set`` of precompute, verify and train; the
    process count follows an overridden nproc_per_node."""
    for target in ("precompute DATA=d", "verify CACHE=c", "train CACHE=c"):
        dry = subprocess.run(["make", "-n", *target.split(), "SET=train.grad_accum=4 cache.resolution=pad448"],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        assert "--profile tiny --set train.grad_accum=4 --set cache.resolution=pad448" in dry, dry
    dry = subprocess.run(["make", "-n", "train", "CACHE=c", "SET=nproc_per_node=3"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "--nproc_per_node 3" in dry
