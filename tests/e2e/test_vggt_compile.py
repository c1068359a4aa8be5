"""``vggt.compile`` fuses the VGGT blocks' elementwise work (``torch.compile``, whose compiler starts
worker processes), within verify's tolerance of the eager path. (The other encoder levers, in
process: tests/unit/test_vggt_levers.py.)"""

from __future__ import annotations

import torch

from helpers.vggt_cases import CPU, episode_windows, tiny_model
from janus_cache.verify.comparison import compare, feature_tolerance
from janus_core.vggt.encoder import WindowEncoder


def test_compiled_blocks_match_the_eager_path_within_verify_tolerance() -> None:
    from torch._dynamo.utils import counters

    eager, fused = tiny_model(), tiny_model()
    fused.fuse()
    graphs = counters["stats"]["unique_graphs"]
    for windows in (episode_windows([3, 11]), episode_windows([5, 6, 12])):  # a second shape recompiles once
        expected = WindowEncoder(eager, "last", -2, torch.float32).encode(windows)
        got = WindowEncoder(fused, "last", -2, torch.float32).encode(windows)
        for live, cached in zip(got, expected):
            comparison = compare(live, cached, feature_tolerance(CPU), "float32")
            assert comparison.ok, comparison
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled regions did run
