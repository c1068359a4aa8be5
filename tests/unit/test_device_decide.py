"""The prepared GPU run's decisions (benchmarks/device_decide.py): the memory a row would need per GPU
under ZeRO-3 over 8 GPUs, the fastest configuration that fits an 80 GB H800/H100 with 10 % to spare,
the h800 profile change that follows, and the targets' verdicts, from rows shaped as the run
writes them (figures of the H100 run where it has them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import device_decide
from benchmarks.device_decide import (
    H800_PROFILE,
    choose_training,
    choose_vggt,
    decide,
    fit,
    profile_diff,
    with_settings,
    zero3_working_gib,
)
from janus_core.profile import load_profile
from janus_train.config import load_train_settings

PARAMS, TRAINABLE = 8_343_000_000, 7_710_000_000  # Qwen2.5-VL-7B + merger, as the H100 run counted
WEIGHTS_GIB = PARAMS * 2 / 2**30


def step(s: float, peak: float, policy: str = "every_4", levers: tuple[str, ...] = (), micro_batch: int = 1,
         base: str = "qwen2_5_vl", **extra: Any) -> dict[str, Any]:
    return {"status": "ok", "section": "training", "path": "janus", "base": base, "checkpointing": policy,
            "levers": list(levers), "micro_batch": micro_batch, "s_per_sample": {"median": s, "min": s, "max": s},
            "peak_gib": peak, "resident_gib": WEIGHTS_GIB, "params": PARAMS, "trainable_params": TRAINABLE,
            "phases_s": {"vit": 0.17 * s, "llm_forward": 0.16 * s, "backward": 0.64 * s}, **extra}


def windows(rate: float, per_call: int = 4, **extra: Any) -> dict[str, Any]:
    return {"status": "ok", "section": "vggt", "windows_per_call": per_call, "tflop_per_s": rate * 60.5,
            "windows_per_s": {"median": rate, "min": rate, "max": rate}, "kernel": "sdpa-cudnn", **extra}


# The H100 run's policies (s/sample, peak GiB); none ran out of its 80 GB and fits nowhere here.
H100_ROWS = {
    "7b_full": step(1.12, 36.1, "full"),
    "7b_every_2": step(1.01, 49.2, "every_2"),
    "7b_every_4": step(0.938, 61.5, "every_4"),
    "7b_none": step(0.80, 96.0, "none"),
}


def test_zero3_memory_per_gpu_is_the_steps_own_memory_plus_the_sharded_state_and_deepspeeds_buckets() -> None:
    # zero3.json: 1e9 live parameters + a 5e8 prefetch bucket + a 5e8 reduce bucket, bf16.
    assert zero3_working_gib() == pytest.approx(2e9 * 2 / 2**30)
    every_4 = fit(H100_ROWS["7b_every_4"])
    assert every_4.activations_gib == pytest.approx(61.5 - WEIGHTS_GIB)
    # (weights + gradients) in bf16 and fp32 Adam state, over 8 GPUs.
    assert every_4.state_gib == pytest.approx((PARAMS * 2 + TRAINABLE * 2 + TRAINABLE * 12) / 8 / 2**30)
    assert every_4.estimate_gib == pytest.approx(every_4.activations_gib + every_4.state_gib + zero3_working_gib())
    assert every_4.bound_gib == pytest.approx(61.5 + every_4.state_gib)
    assert every_4.limit_gib == pytest.approx(79.2 * 0.9) and every_4.fits
    assert not fit(H100_ROWS["7b_none"]).fits
    assert fit({**H100_ROWS["7b_full"], "peak_gib": None}) is None  # a CPU row has no memory figure


def test_the_fastest_row_that_fits_is_chosen_and_a_lever_within_two_percent_is_not_worth_it() -> None:
    rows = {**H100_ROWS, "7b_vit_cache": step(0.77, 61.0, levers=("vit_cache",)),
            "7b_compile": step(0.86, 58.0, levers=("compile",)),
            "7b_all": step(0.765, 57.0, levers=("vit_cache", "compile"))}
    chosen = choose_training(rows)
    # 7b_all is faster, but by under MIN_GAIN: the ViT cache alone (one lever, no compile at start) wins.
    assert chosen["row"] == "7b_vit_cache" and chosen["checkpointing"] == "every_4" and chosen["levers"] == ["vit_cache"]
    rows["7b_all"] = step(0.70, 57.0, levers=("vit_cache", "compile"))
    assert choose_training(rows)["row"] == "7b_all"
    # 7b_none is the fastest but does not fit an 80 GB GPU under ZeRO-3: never chosen.
    assert choose_training({**rows, "7b_none": step(0.5, 96.0, "none")})["row"] == "7b_all"


def test_a_micro_batch_counts_with_zero3_traffic_spread_over_its_samples() -> None:
    mb1 = H100_ROWS["7b_every_4"]
    mb2 = step(0.93, 66.0, micro_batch=2)
    # ZeRO-3 moves (params + 2 trainable) bf16 bytes x 7/8 per micro-batch at the H800's 200 GB/s.
    traffic = (PARAMS + 2 * TRAINABLE) * 2 * 7 / 8 / 200e9
    assert device_decide.projected(mb1) == pytest.approx(0.938 + traffic)
    assert device_decide.projected(mb2) == pytest.approx(0.93 + traffic / 2)
    assert choose_training({"7b_every_4": mb1, "7b_mb2": mb2})["micro_batch"] == 2
    # Out of the 80 GB with its spare: the one-sample row stays.
    assert choose_training({"7b_every_4": mb1, "7b_mb2": step(0.93, 80.0, micro_batch=2)})["micro_batch"] == 1


def test_vit_cache_rows_are_left_out_when_cached_and_live_vit_output_differ_beyond_verifys_tolerance() -> None:
    rows = {**H100_ROWS, "7b_vit_cache": step(0.77, 61.0, levers=("vit_cache",)),
            "vit_cache_numerics": {"status": "ok", "section": "numerics", "within_tolerance": False}}
    chosen = choose_training(rows)
    assert chosen["row"] == "7b_every_4" and chosen["vit_cache_excluded"]


def test_vggt_compile_is_chosen_only_for_a_gain_within_tolerance_and_a_bigger_batch_only_for_a_gain() -> None:
    within = {"within_tolerance": True, "max_abs": 0.01, "bound": 0.1, "cosine": 0.9999, "identical": False}
    rows = {"vggt_baseline": windows(4.0), "vggt_compile": windows(4.6, vs_baseline=within),
            "vggt_all": windows(7.0), "vggt_all_best_b": windows(7.1, per_call=8)}
    decided = choose_vggt(rows)
    assert decided["compile"]["value"] and decided["compile"]["gain"] == pytest.approx(0.15)
    assert decided["batch"]["value"] == 4  # 1.4 % more windows/s at B=8: not worth it
    rows["vggt_all_best_b"] = windows(8.0, per_call=16)
    assert choose_vggt(rows)["batch"]["value"] == 16
    rows["vggt_compile"] = windows(4.6, vs_baseline={**within, "within_tolerance": False})
    assert not choose_vggt(rows)["compile"]["value"]
    assert "compile" not in choose_vggt({"vggt_baseline": windows(4.0)})  # its row not measured: undecided


def test_the_profile_change_edits_the_h800_profile_in_place_and_the_result_loads(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {"train.gradient_checkpointing": "every_4", "train.micro_batch": 2, "train.grad_accum": 4,
                "cache.vit_features": True, "train.compile_layers": True, "vggt.compile": True}
    diff, set_line = profile_diff(settings)
    assert "-  gradient_checkpointing: full\n+  gradient_checkpointing: every_4\n" in diff
    assert "-  micro_batch: 1\n-  grad_accum: 8\n+  micro_batch: 2\n+  grad_accum: 4\n" in diff
    assert diff.endswith("   prompt_template: janusvln.yaml\n+  compile_layers: true\n")  # added to its section
    assert "-  compile: false\n+  compile: true\n" in diff and "   vggt_batch: 4\n+  vit_features: true\n vggt:" in diff
    assert set_line.startswith('SET="') and "train.gradient_checkpointing=every_4" in set_line
    text = with_settings(H800_PROFILE.read_text(), settings)
    data = yaml.safe_load(text)
    assert data["cache"]["vit_features"] is True and data["train"]["grad_accum"] == 4 and data["vggt"]["compile"]
    # Every other line stays, comments included.
    assert all(line in text.splitlines() for line in H800_PROFILE.read_text().splitlines()
               if not line.strip().startswith(("gradient_checkpointing:", "micro_batch:", "grad_accum:", "compile:")))
    # The same change as make's SET, through the profile loader's own overrides: the h800 profile with it loads.
    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("JANUS_VGGT_PATH", str(tmp_path))
    monkeypatch.setenv("JANUS_QWEN_PATH", str(H800_PROFILE.parent.parent / "models" / "qwen2_5_vl_7b"))
    profile = load_profile("h800", set_line.removeprefix('SET="').removesuffix('"').split())
    train = load_train_settings(profile)
    assert (str(train.gradient_checkpointing), train.micro_batch, train.grad_accum) == ("every_4", 2, 4)
    assert train.compile_layers and profile.cache.vit_features and profile.vggt.compile
    assert profile_diff({"train.gradient_checkpointing": "full"}) == ("", "")  # already so: no change


def test_decisions_name_the_chosen_row_the_settings_what_waits_and_each_targets_verdict() -> None:
    rows = {**H100_ROWS, "7b_vit_cache": step(0.77, 61.0, levers=("vit_cache",)),
            "7b_best": step(0.77, 61.0, levers=("vit_cache",), profile={"top_ops": [{"op": "aten::mm", "share": 0.4}]}),
            "vggt_b8": windows(4.08, per_call=8), "vggt_all": windows(6.4)}
    decided = decide(rows)
    assert decided["training"]["row"] in ("7b_vit_cache", "7b_best")
    assert decided["settings"]["cache.vit_features"] is True
    assert decided["settings"]["train.gradient_checkpointing"] == "every_4"
    assert any(line.startswith("vggt.compile") for line in decided["waiting"])
    assert any(line.startswith("cache.vit_features") for line in decided["waiting"])  # its numerics row is missing
    step_target = decided["targets"]["gpu_s_per_sample"]
    assert not step_target["met"] and step_target["gap"] == pytest.approx(0.77 - 0.6)
    assert step_target["top_phase"]["phase"] == "backward" and step_target["top_ops"][0]["op"] == "aten::mm"
    vggt_target = decided["targets"]["vggt_windows_per_s"]
    assert vggt_target["row"] == "vggt_all" and vggt_target["met"] and not vggt_target["stretch_met"]
    assert "gradient_checkpointing: every_4" in decided["profile_diff"]
    nothing = decide({})
    assert nothing["training"] is None and nothing["settings"] == {} and nothing["profile_diff"] == ""
