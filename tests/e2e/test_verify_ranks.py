"""``torchrun -m pipelines.verify``: two ranks split the live check and rank 0 prints the JSON
report. The ranks start as torchrun starts them, forked from a process that imported the command
once (helpers.forked_ranks). (Every check and its report, in process: tests/unit/test_verify.py.)"""

from __future__ import annotations

import json

from helpers.forked_ranks import forked_launch
from helpers.shared_caches import VerifyCaches
from janus_cache.store.layout import SAMPLES_TABLE
from janus_cache.verify import choose_live_rows, open_for_checks


def test_torchrun_splits_the_live_check_over_ranks_and_prints_the_json_report(verify_caches: VerifyCaches) -> None:
    built = verify_caches
    result = forked_launch("pipelines.verify", built.zarr, "--data", built.data, "--live", "4", "--json", "-",
                           timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["world_size"] == 2 and report["passed"] is True
    live = next(c for c in report["checks"] if c["name"] == "live")
    keys = [s["key"] for s in live["data"]["samples"]]
    cache_keys = open_for_checks(built.zarr).keys(SAMPLES_TABLE)
    assert keys == [cache_keys[r] for r in choose_live_rows(built.zarr, 4, seed=0)]
    assert "check" in result.stderr and "live" in result.stderr  # the table went to stderr
