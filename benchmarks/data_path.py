"""The data path at the real shape (640x480 PNG sources, 9 frames, pad644): the live reference path
(decode, resize, transformers' image processor, tokenising) against the cached one (zarr read,
lookup-table ``pixel_values``, tokenising), per core and with loader workers. Measured by
``make bench`` and by ``make bench-gpu`` on the host's cores."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks.measure import rates
from janus_cache.keys import window_variant
from janus_cache.store import open_cache
from janus_core.imaging import load_frame, qwen_pixel_values
from janus_core.index import build_index
from janus_core.profile import PROFILES_DIR, load_profile
from janus_core.resolution import Resolution, visual_tokens
from janus_core.sample_data import write_sample_data
from pipelines.precompute_run import Options
from pipelines.precompute_run import run as run_precompute


def bench_profile(tmp: Path, resolution: str, **cache: Any) -> Path:
    """The tiny profile at another resolution/shard size (model paths made absolute)."""
    data = yaml.safe_load((PROFILES_DIR / "tiny.yaml").read_text())
    data["cache"].update(resolution=resolution, **cache)
    data["vggt"]["config"] = str((PROFILES_DIR / data["vggt"]["config"]).resolve())
    data["qwen"]["path"] = str((PROFILES_DIR / data["qwen"]["path"]).resolve())
    path = tmp / f"bench-{resolution}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def data_path(work: Path, repeats: int, workers: int) -> dict[str, Any]:
    """Live reference path vs cached path for one sample (9 frames at pad644 + tokens)."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from janus_train.data.prompt import PromptBuilder, PromptFields

    data = work / "data644"
    write_sample_data(data, episodes=1, steps=8, seed=1)
    profile_path = bench_profile(work, "pad644", samples_per_shard=4, frames_per_shard=8, vggt_batch=1)
    cache = work / "cache644"
    if run_precompute(Options(data, cache, str(profile_path), workers=1)) != 0:
        raise RuntimeError("precompute of the pad644 benchmark cache failed")
    profile = load_profile(profile_path)
    res = Resolution.parse("pad644")
    index = build_index(data, history=profile.cache.history, subinstruction_rule=profile.cache.subinstruction_rule)
    tokenizer = AutoTokenizer.from_pretrained(str(profile.qwen.path))
    builder = PromptBuilder(tokenizer, visual_tokens(res))
    side = res.target
    processor = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side)
    reader = open_cache(cache, resolution=res.name, variant=window_variant(profile.cache).name).reader
    n = len(index.samples)

    def live_sample(row: int) -> None:
        sample = index.samples[row]
        frames = [load_frame(index.frames[r].path, res) for r in sample.window_rows]
        # As JanusVLN feeds it: the [0, 1] float tensor, rescaling off, no further resize.
        images = [torch.from_numpy(f).permute(2, 0, 1).float().div(255) for f in frames]
        processor(images, do_rescale=False, return_tensors="pt")
        builder.build_sample(sample)

    def cached_sample(row: int) -> None:
        item = reader.sample(row)
        qwen_pixel_values(torch.from_numpy(item.frames))
        builder.build(PromptFields.of(item.meta), n_images=item.frames.shape[0], key=item.key)

    def per_core(fn: Callable[[int], None]) -> Callable[[], int]:
        def run() -> int:
            for row in range(n):
                fn(row)
            return n
        return run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        live_core = rates(per_core(live_sample), repeats)
        cached_core = rates(per_core(cached_sample), repeats)
    finally:
        torch.set_num_threads(threads)

    def with_workers(fn: Callable[[int], None]) -> Callable[[], int]:
        dataset = _CallDataset(fn, n)

        def run() -> int:
            loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                                 multiprocessing_context="fork")
            return sum(1 for _ in loader)
        return run

    live_workers = rates(with_workers(live_sample), max(1, repeats // 2))
    cached_workers = rates(with_workers(cached_sample), max(1, repeats // 2))
    return {
        "samples": n,
        "frames_per_sample": index.history + 1,
        "resolution": res.name,
        "live_per_core": asdict(live_core),
        "cached_per_core": asdict(cached_core),
        "speedup_per_core": cached_core.median / live_core.median,
        "loader_workers": workers,
        "live_with_workers": asdict(live_workers),
        "cached_with_workers": asdict(cached_workers),
        "speedup_with_workers": cached_workers.median / live_workers.median,
        "cache": str(cache),
    }


class _CallDataset(torch.utils.data.Dataset):
    def __init__(self, fn: Callable[[int], None], n: int) -> None:
        self.fn, self.n = fn, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, row: int) -> int:
        self.fn(row)
        return row
