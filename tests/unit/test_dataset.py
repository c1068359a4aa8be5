"""The dataset index: episodes, frames and samples read from episode folders or annotation files,
with every bad input reported (and skipped, or fatal in strict mode)."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from janus_core.index import (
    ACTIONS,
    DatasetError,
    DatasetIndex,
    Reason,
    build_index,
    source_identity,
    subinstruction_for,
)
from janus_core.system.files import sha256_file
from janus_core.windows import window_frames

SAMPLE_EPISODES, SAMPLE_STEPS = 3, 12  # the shape of conftest's sample_dataset
EP = "episode_0000"
OTHER = "episode_0001"


def frame_png(root: Path, episode: str, step: int) -> Path:
    (path,) = sorted((root / episode).glob(f"step_{step:04d}_*.png"))
    return path


def keys(index: DatasetIndex) -> set[str]:
    return {sample.key for sample in index.samples}


def episode_keys(episode: str, steps: range | list[int] = range(SAMPLE_STEPS)) -> set[str]:
    return {f"{episode}/{step}" for step in steps}


# ---------------------------------------------------------------------------------------------
# The index of a clean episode-folder dataset


def test_sample_dataset_indexes_every_frame_as_a_sample_with_no_problems(sample_index: DatasetIndex) -> None:
    assert len(sample_index.episodes) == SAMPLE_EPISODES
    assert len(sample_index.frames) == SAMPLE_EPISODES * SAMPLE_STEPS
    assert len(sample_index.samples) == SAMPLE_EPISODES * SAMPLE_STEPS
    assert sample_index.report.entries == ()
    assert sample_index.source_format == "episodes"
    assert sample_index.history == 8


def test_episodes_frames_and_samples_are_in_episode_then_step_order_with_stable_keys(
    sample_index: DatasetIndex,
) -> None:
    episodes = [f"episode_{i:04d}" for i in range(SAMPLE_EPISODES)]
    assert [e.episode_id for e in sample_index.episodes] == episodes
    expected = [(ep, step) for ep in episodes for step in range(SAMPLE_STEPS)]
    assert [(f.episode_id, f.index) for f in sample_index.frames] == expected
    assert [(s.episode_id, s.step) for s in sample_index.samples] == expected
    assert [s.key for s in sample_index.samples] == [f"{ep}/{step}" for ep, step in expected]
    assert [f.row for f in sample_index.frames] == list(range(len(sample_index.frames)))
    assert [s.row for s in sample_index.samples] == list(range(len(sample_index.samples)))


def test_each_sample_window_follows_the_window_rule_and_points_at_its_own_episode_frames(
    sample_index: DatasetIndex,
) -> None:
    for sample in sample_index.samples:
        assert sample.window == window_frames(sample.step, 8)
        frames = sample_index.window(sample)
        assert [f.episode_id for f in frames] == [sample.episode_id] * 9
        assert tuple(f.index for f in frames) == sample.window
        assert frames[-1].index == sample.step == sample.frame_index
    late = sample_index.sample(f"{EP}/11")
    assert late.window == (0, 1, 2, 4, 5, 6, 8, 9, 11)
    assert sample_index.sample(f"{EP}/2").window == (0, 0, 0, 0, 0, 0, 0, 1, 2)


def test_sample_texts_and_actions_come_from_the_episode_files(sample_dataset: Path, sample_index: DatasetIndex) -> None:
    for episode in sample_index.episodes:
        milestones = json.loads((sample_dataset / episode.episode_id / "milestones_result.json").read_text())
        assert episode.instruction == milestones["instruction_text"]
        for sample in sample_index.samples_of(episode.episode_id):
            png = frame_png(sample_dataset, sample.episode_id, sample.step)
            texts = json.loads(png.with_suffix(".json").read_text())
            assert sample.instruction == milestones["instruction_text"]
            assert sample.description_2d == texts["landmark_description"]
            assert sample.description_3d == texts["spatial_description"]
            assert png.stem.endswith("_" + sample.action)
            assert ACTIONS[sample.action_id] == sample.action


def test_subinstructions_are_assigned_by_completion_checkpoints(
    sample_dataset: Path, sample_index: DatasetIndex
) -> None:
    for episode in sample_index.episodes:
        milestones = json.loads((sample_dataset / episode.episode_id / "milestones_result.json").read_text())
        subs = milestones["subinstructions"]
        checkpoints = [c["checkpoint_frame_index"] for c in milestones["completion_checkpoints"]]
        expected: dict[int, str] = {}
        first = 0
        for sub, checkpoint in zip(subs, checkpoints):
            expected.update({frame: sub for frame in range(first, checkpoint + 1)})
            first = checkpoint + 1
        for sample in sample_index.samples_of(episode.episode_id):
            assert sample.subinstruction == expected.get(sample.step, subs[-1])


def test_subinstruction_rule_covers_checkpoint_ranges_and_frames_past_the_last_checkpoint() -> None:
    subs = ["a", "b", "c"]
    assert [subinstruction_for(f, subs, [3, 7]) for f in range(10)] == list("aaaabbbbcc")
    assert [subinstruction_for(f, subs, [3, 7, 8]) for f in range(11)] == list("aaaabbbbccc")
    # More checkpoints than subinstructions: frames past the last listed one keep the last text.
    assert [subinstruction_for(f, ["a", "b"], [1, 2, 3]) for f in range(6)] == list("aabbbb")
    assert [subinstruction_for(f, ["only"], []) for f in range(3)] == ["only"] * 3


def test_subinstruction_rule_janus_counts_completed_checkpoints_when_there_are_few() -> None:
    subs = ["a", "b", "c"]
    assert [subinstruction_for(f, subs, [3], "janus") for f in range(7)] == list("aaaabbb")
    assert [subinstruction_for(f, subs, [], "janus") for f in range(3)] == list("aaa")
    assert [subinstruction_for(f, subs, [3, 7], "janus") for f in range(10)] == list("aaaabbbbcc")
    with pytest.raises(ValueError, match="subinstruction_rule must be one of reference, janus, got 'newest'"):
        subinstruction_for(0, subs, [3], "newest")


def test_subinstruction_rule_reference_gives_the_last_text_to_every_frame_when_checkpoints_are_few() -> None:
    """The reference rule: ranges [c_{i-1}+1, c_i], a missing end runs to the last frame, a missing
    start is 0, later subinstructions overwrite earlier ones, uncovered frames get the last."""
    subs = ["a", "b", "c"]
    assert [subinstruction_for(f, subs, [3]) for f in range(7)] == list("ccccccc")
    assert [subinstruction_for(f, subs, []) for f in range(3)] == list("ccc")
    assert [subinstruction_for(f, ["a", "b"], []) for f in range(3)] == list("bbb")
    assert [subinstruction_for(f, ["a", "b"], [2]) for f in range(5)] == list("aaabb")
    assert [subinstruction_for(f, subs, [1, 4, 6]) for f in range(9)] == list("aabbbcccc")


def _rewrite_milestones(root: Path, episode: str, **fields: Any) -> None:
    path = root / episode / "milestones_result.json"
    _write_json(path, {**json.loads(path.read_text()), **fields})


def _checkpoints(*frames: int) -> list[dict[str, int]]:
    return [{"checkpoint_frame_index": frame} for frame in frames]


def test_episodes_with_few_checkpoints_follow_the_reference_rule_by_default_and_janus_on_request(
    dataset_copy: Path,
) -> None:
    _rewrite_milestones(
        dataset_copy, EP, subinstructions=["walk to the door", "turn left", "stop at the sofa"],
        completion_checkpoints=_checkpoints(4),
    )
    reference = build_index(dataset_copy)
    assert reference.subinstruction_rule == "reference"
    assert {s.subinstruction for s in reference.samples_of(EP)} == {"stop at the sofa"}
    janus = build_index(dataset_copy, subinstruction_rule="janus")
    assert janus.subinstruction_rule == "janus"
    texts = [s.subinstruction for s in janus.samples_of(EP)]
    assert texts == ["walk to the door"] * 5 + ["turn left"] * (SAMPLE_STEPS - 5)
    # Episodes with a checkpoint per subinstruction read the same under both rules.
    assert reference.samples_of(OTHER) == janus.samples_of(OTHER)
    with pytest.raises(ValueError, match="subinstruction_rule must be one of reference, janus, got 'Reference'"):
        build_index(dataset_copy, subinstruction_rule="Reference")


def test_checkpoints_are_used_in_sorted_order_like_the_reference(dataset_copy: Path) -> None:
    _rewrite_milestones(
        dataset_copy, EP, subinstructions=["a", "b", "c"], completion_checkpoints=_checkpoints(7, 3, 11)
    )
    index = build_index(dataset_copy)
    assert index.report.entries == ()
    assert index.episode(EP).checkpoints == (3, 7, 11)
    assert "".join(s.subinstruction for s in index.samples_of(EP)) == "aaaabbbbcccc"


def test_episode_texts_are_stripped_keep_inner_newlines_and_lists_give_their_first_element(
    dataset_copy: Path,
) -> None:
    _rewrite_milestones(
        dataset_copy, EP,
        instruction_text="  Walk to the kitchen.\nThen stop by the sink. \n",
        subinstructions=[["  walk to the kitchen\n", "an alternative wording"], "\tstop by\nthe sink  "],
        completion_checkpoints=_checkpoints(5, 11),
    )
    description = frame_png(dataset_copy, EP, 7).with_suffix(".json")
    _write_json(description, {
        "landmark_description": ["  A door.\nA lamp.  ", "a second description"],
        "spatial_description": "\n The door is 2 m ahead.\r\nThe lamp is left. ",
    })
    index = build_index(dataset_copy)
    assert index.report.entries == ()
    sample = index.sample(f"{EP}/7")
    assert sample.instruction == "Walk to the kitchen.\nThen stop by the sink."
    assert index.episode(EP).subinstructions == ("walk to the kitchen", "stop by\nthe sink")
    assert sample.subinstruction == "stop by\nthe sink"
    assert index.sample(f"{EP}/2").subinstruction == "walk to the kitchen"
    assert sample.description_2d == "A door.\nA lamp."
    assert sample.description_3d == "The door is 2 m ahead.\r\nThe lamp is left."


def test_texts_that_are_blank_or_empty_lists_are_reported_as_empty(dataset_copy: Path) -> None:
    _write_json(frame_png(dataset_copy, EP, 7).with_suffix(".json"),
                {"landmark_description": [], "spatial_description": " \n "})
    _rewrite_milestones(dataset_copy, OTHER, subinstructions=["go", ["  "]])
    index = build_index(dataset_copy)
    (empty,) = index.report.by_reason(Reason.EMPTY_DESCRIPTION)
    assert empty.sample_key == f"{EP}/7"
    assert empty.detail.startswith("missing or empty landmark_description and spatial_description")
    (invalid,) = index.report.by_reason(Reason.INVALID_MILESTONES)
    assert invalid.file == str(dataset_copy / OTHER / "milestones_result.json")
    assert invalid.detail.startswith("subinstructions[1] is missing or empty")


def test_the_subinstruction_rule_is_a_cache_setting_keyed_in_the_dataset_identity(
    dataset_copy: Path, tmp_path: Path
) -> None:
    from dataclasses import replace

    from helpers.profiles import write_test_profile
    from janus_cache.keys import dataset_identity
    from janus_cache.store.manifest import DatasetIdentity, Manifest, ShardSizes, WindowVariant, keyed_differences
    from janus_core.profile import ProfileError, load_profile

    assert load_profile("tiny").cache.subinstruction_rule == "reference"
    profile = load_profile(write_test_profile(tmp_path / "janus.yaml", cache={"subinstruction_rule": "janus"}))
    assert profile.cache.subinstruction_rule == "janus"
    with pytest.raises(ProfileError, match="'cache.subinstruction_rule' is 'newest'; expected one of reference, janus"):
        load_profile(write_test_profile(tmp_path / "bad.yaml", cache={"subinstruction_rule": "newest"}))

    reference = dataset_identity(build_index(dataset_copy))
    janus = dataset_identity(build_index(dataset_copy, subinstruction_rule=profile.cache.subinstruction_rule))
    assert (reference.subinstruction_rule, janus.subinstruction_rule) == ("reference", "janus")
    assert replace(reference, subinstruction_rule="janus") == janus  # the frames are the same

    def manifest_with(identity: DatasetIdentity) -> Manifest:
        window = WindowVariant(history=8, sampling="linspace", reference_frame="first", layer=-2, attention="causal")
        return Manifest(format="zarr", window=window, encoder_fingerprint="sha256:" + "12" * 32,
                        feature_dtype="bfloat16", dataset=identity, layout=ShardSizes(64, 16), resolutions={})

    stored = Manifest.from_json(manifest_with(janus).to_json())
    assert stored.dataset.subinstruction_rule == "janus"
    assert [str(d) for d in keyed_differences(stored, manifest_with(reference))] == [
        "dataset.subinstruction_rule: cache has 'janus', wanted 'reference'"
    ]


def test_lookups_by_key_episode_and_frame_index(sample_index: DatasetIndex) -> None:
    sample = sample_index.sample(f"{OTHER}/5")
    assert (sample.episode_id, sample.step) == (OTHER, 5)
    frames = sample_index.frames_of(OTHER)
    assert [f.index for f in frames] == list(range(SAMPLE_STEPS))
    assert sample_index.frame(OTHER, 7) is frames[7]
    assert sample_index.episode(OTHER).frame_rows == tuple(f.row for f in frames)
    with pytest.raises(KeyError, match="episode_0001/99"):
        sample_index.sample(f"{OTHER}/99")
    with pytest.raises(KeyError, match="nope"):
        sample_index.episode("nope")


def test_the_index_is_immutable(sample_index: DatasetIndex) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample_index.samples = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample_index.samples[0].instruction = "x"  # type: ignore[misc]
    assert isinstance(sample_index.samples, tuple) and isinstance(sample_index.frames, tuple)


def test_frames_record_source_size_file_size_and_content_hash(sample_index: DatasetIndex) -> None:
    identity = source_identity(sample_index)
    assert len(identity) == len(sample_index.frames)
    for frame, (relpath, width, height, nbytes) in zip(sample_index.frames, identity):
        assert relpath == f"{frame.episode_id}/{frame.path.name}"
        assert (width, height) == (640, 480) == (frame.width, frame.height)
        assert nbytes == frame.path.stat().st_size
        assert frame.sha256 == sha256_file(frame.path)
    assert len({f.sha256 for f in sample_index.frames}) == len(sample_index.frames)


def test_summary_counts_what_the_cli_prints(sample_index: DatasetIndex) -> None:
    summary = sample_index.summary()
    as_dict = summary.to_dict()
    assert (as_dict["episodes"], as_dict["frames"], as_dict["samples"]) == (3, 36, 36)
    assert as_dict["images_per_sample"] == 9
    assert as_dict["skipped"] == {} and as_dict["problems_total"] == 0
    json.dumps(as_dict)
    text = summary.format()
    assert "samples           36" in text and "problems          none" in text


def test_building_twice_gives_equal_indexes_independent_of_threads(
    sample_dataset: Path, sample_index: DatasetIndex
) -> None:
    assert build_index(sample_dataset) == sample_index
    assert build_index(sample_dataset, workers=1) == sample_index


def test_order_does_not_depend_on_the_order_files_were_created(sample_dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "reversed"
    copy.mkdir()
    for episode in sorted(sample_dataset.iterdir(), reverse=True):
        (copy / episode.name).mkdir()
        for file in sorted(episode.iterdir(), reverse=True):
            shutil.copy2(file, copy / episode.name / file.name)
    original, rebuilt = build_index(sample_dataset), build_index(copy)
    assert [s.key for s in rebuilt.samples] == [s.key for s in original.samples]
    assert [s.window_rows for s in rebuilt.samples] == [s.window_rows for s in original.samples]
    assert rebuilt.source_identity() == original.source_identity()


def test_an_episode_shorter_than_the_window_pads_every_window_with_frame_zero(tmp_path: Path) -> None:
    from janus_core.sample_data import write_sample_data

    root = write_sample_data(tmp_path / "short", episodes=1, steps=3, seed=5)
    index = build_index(root)
    assert [s.window for s in index.samples] == [
        (0, 0, 0, 0, 0, 0, 0, 0, 0),
        (0, 0, 0, 0, 0, 0, 0, 0, 1),
        (0, 0, 0, 0, 0, 0, 0, 1, 2),
    ]
    assert index.report.entries == ()


def test_history_size_is_configurable(sample_dataset: Path) -> None:
    index = build_index(sample_dataset, history=4, check_images=False)
    assert index.sample(f"{EP}/2").window == (0, 0, 0, 1, 2)
    assert index.sample(f"{EP}/11").window == (0, 2, 5, 8, 11)
    assert index.summary().images_per_sample == 5


def test_a_frame_without_descriptions_is_not_a_sample_but_stays_a_history_frame(dataset_copy: Path) -> None:
    frame_png(dataset_copy, EP, 4).with_suffix(".json").unlink()
    index = build_index(dataset_copy)
    assert f"{EP}/4" not in keys(index)
    assert index.frame(EP, 4).index == 4
    later = index.sample(f"{EP}/11")
    assert 4 in later.window
    assert index.window(later)[later.window.index(4)].path == frame_png(dataset_copy, EP, 4)


def test_image_checks_can_be_limited_to_headers(dataset_copy: Path) -> None:
    """Without full checks a non-image is still found, a truncated PNG is not, and no hash is taken."""
    truncated = frame_png(dataset_copy, EP, 4)
    truncated.write_bytes(truncated.read_bytes()[:5000])
    frame_png(dataset_copy, EP, 6).write_text("not an image")
    index = build_index(dataset_copy, check_images=False)
    assert [e.file for e in index.report.by_reason(Reason.NOT_AN_IMAGE)] == [str(frame_png(dataset_copy, EP, 6))]
    assert index.report.by_reason(Reason.UNREADABLE_IMAGE) == ()
    assert all(f.sha256 is None for f in index.frames)


# ---------------------------------------------------------------------------------------------
# Bad input in episode folders: each case reports (file, reason) and skips exactly what it affects


@dataclass
class Damage:
    reason: Reason
    files: list[Path]
    lost: set[str]
    kept: set[str] = field(default_factory=set)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))


def missing_milestones(root: Path) -> Damage:
    path = root / EP / "milestones_result.json"
    path.unlink()
    return Damage(Reason.MISSING_MILESTONES, [path], episode_keys(EP), episode_keys(OTHER))


def malformed_milestones(root: Path) -> Damage:
    path = root / EP / "milestones_result.json"
    path.write_text('{"instruction_text": "go", ')
    return Damage(Reason.MALFORMED_JSON, [path], episode_keys(EP), episode_keys(OTHER))


def milestones_without_subinstructions(root: Path) -> Damage:
    path = root / EP / "milestones_result.json"
    _write_json(path, {"instruction_text": "go", "completion_checkpoints": []})
    return Damage(Reason.INVALID_MILESTONES, [path], episode_keys(EP), episode_keys(OTHER))


def malformed_frame_json(root: Path) -> Damage:
    path = frame_png(root, EP, 4).with_suffix(".json")
    path.write_text('{"landmark_description": "a wall"')
    return Damage(Reason.MALFORMED_JSON, [path], {f"{EP}/4"}, {f"{EP}/5", f"{EP}/11"})


def missing_frame_json(root: Path) -> Damage:
    path = frame_png(root, EP, 4).with_suffix(".json")
    path.unlink()
    return Damage(Reason.MISSING_FRAME_JSON, [path], {f"{EP}/4"}, {f"{EP}/5", f"{EP}/11"})


def empty_description(root: Path) -> Damage:
    path = frame_png(root, EP, 4).with_suffix(".json")
    _write_json(path, {"landmark_description": "   ", "spatial_description": "a wall 2 m ahead"})
    return Damage(Reason.EMPTY_DESCRIPTION, [path], {f"{EP}/4"}, {f"{EP}/5", f"{EP}/11"})


def unknown_action(root: Path) -> Damage:
    png = frame_png(root, EP, 5)
    renamed = png.with_name("step_0005_JUMP.png")
    png.rename(renamed)
    png.with_suffix(".json").rename(renamed.with_suffix(".json"))
    # The frame's pixels are fine: it stays a history frame of later samples.
    return Damage(Reason.UNKNOWN_ACTION, [renamed], {f"{EP}/5"}, {f"{EP}/9", f"{EP}/11"})


# Window of step j contains frame 4 for j in 4..9 and 11, not for 10 (0,1,2,3,5,6,7,8,10).
_WITH_FRAME_4 = episode_keys(EP, [4, 5, 6, 7, 8, 9, 11])
_WITHOUT_FRAME_4 = episode_keys(EP, [0, 1, 2, 3, 10])


def truncated_png(root: Path) -> Damage:
    path = frame_png(root, EP, 4)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return Damage(Reason.UNREADABLE_IMAGE, [path], _WITH_FRAME_4, _WITHOUT_FRAME_4)


def png_cut_inside_its_end_chunk(root: Path) -> Damage:
    """Pixel data complete, IEND chunk short by one byte: PIL's verify() alone accepts this."""
    path = frame_png(root, EP, 4)
    path.write_bytes(path.read_bytes()[:-1])
    return Damage(Reason.UNREADABLE_IMAGE, [path], _WITH_FRAME_4, _WITHOUT_FRAME_4)


def corrupted_png(root: Path) -> Damage:
    path = frame_png(root, EP, 4)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return Damage(Reason.UNREADABLE_IMAGE, [path], _WITH_FRAME_4, _WITHOUT_FRAME_4)


def truncated_jpeg(root: Path) -> Damage:
    png = frame_png(root, EP, 4)
    jpg = png.with_suffix(".jpg")
    buffer = io.BytesIO()
    Image.open(png).save(buffer, format="JPEG", quality=90)
    jpg.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) * 2 // 3])
    png.unlink()
    return Damage(Reason.UNREADABLE_IMAGE, [jpg], _WITH_FRAME_4, _WITHOUT_FRAME_4)


def text_file_named_like_a_frame(root: Path) -> Damage:
    path = frame_png(root, EP, 4)
    path.write_text("this is not a picture\n")
    return Damage(Reason.NOT_AN_IMAGE, [path], _WITH_FRAME_4, _WITHOUT_FRAME_4)


def duplicate_step(root: Path) -> Damage:
    png = frame_png(root, EP, 4)
    twin = png.with_name("step_4_TURN_LEFT.png")
    shutil.copy(png, twin)
    shutil.copy(png.with_suffix(".json"), twin.with_suffix(".json"))
    return Damage(Reason.DUPLICATE_STEP, [png, twin], _WITH_FRAME_4, _WITHOUT_FRAME_4)


def missing_step(root: Path) -> Damage:
    png = frame_png(root, EP, 6)
    png.unlink()
    png.with_suffix(".json").unlink()
    # Every window from step 6 on contains frame 6, so all later samples go; earlier ones stay.
    return Damage(
        Reason.MISSING_STEP, [root / EP / "step_0006_*"], episode_keys(EP, range(6, 12)), episode_keys(EP, range(6))
    )


def frame_name_without_action(root: Path) -> Damage:
    path = root / EP / "step_0002.png"
    shutil.copy(frame_png(root, EP, 2), path)
    return Damage(Reason.BAD_FRAME_NAME, [path], set(), episode_keys(EP))


def description_without_image(root: Path) -> Damage:
    path = root / EP / "step_0030_STOP.json"
    shutil.copy(frame_png(root, EP, 2).with_suffix(".json"), path)
    return Damage(Reason.MISSING_IMAGE, [path], set(), episode_keys(EP))


def episode_without_frames(root: Path) -> Damage:
    folder = root / "episode_0100"
    folder.mkdir()
    shutil.copy(root / EP / "milestones_result.json", folder / "milestones_result.json")
    return Damage(Reason.EMPTY_EPISODE, [folder], set(), episode_keys(EP))


FOLDER_DAMAGES: list[Callable[[Path], Damage]] = [
    missing_milestones,
    malformed_milestones,
    milestones_without_subinstructions,
    malformed_frame_json,
    missing_frame_json,
    empty_description,
    unknown_action,
    truncated_png,
    png_cut_inside_its_end_chunk,
    corrupted_png,
    truncated_jpeg,
    text_file_named_like_a_frame,
    duplicate_step,
    missing_step,
    frame_name_without_action,
    description_without_image,
    episode_without_frames,
]


@pytest.mark.parametrize("damage", FOLDER_DAMAGES, ids=lambda f: f.__name__)
def test_bad_episode_input_is_reported_and_only_the_affected_samples_are_skipped(
    damage: Callable[[Path], Damage], dataset_copy: Path
) -> None:
    expected = damage(dataset_copy)
    index = build_index(dataset_copy)
    found = index.report.by_reason(expected.reason)
    assert sorted(e.file for e in found) == sorted(str(f) for f in expected.files), index.report.lines()
    every = {f"episode_{e:04d}/{step}" for e in range(SAMPLE_EPISODES) for step in range(SAMPLE_STEPS)}
    assert keys(index) == every - expected.lost
    assert expected.kept <= keys(index)
    # Each lost sample is named by an entry, except when its whole episode is skipped.
    named = {e.sample_key for e in index.report}
    assert expected.lost <= named or expected.lost == episode_keys(EP)
    summary = index.summary()
    assert summary.skipped[expected.reason.value] == len(found)
    assert summary.samples == len(index.samples) == SAMPLE_EPISODES * SAMPLE_STEPS - len(expected.lost)
    assert expected.files[0].name in summary.format()


@pytest.mark.parametrize("damage", FOLDER_DAMAGES, ids=lambda f: f.__name__)
def test_strict_mode_fails_on_bad_episode_input_naming_the_file_and_reason(
    damage: Callable[[Path], Damage], dataset_copy: Path
) -> None:
    expected = damage(dataset_copy)
    with pytest.raises(DatasetError) as raised:
        build_index(dataset_copy, strict=True)
    message = str(raised.value)
    assert "\n" not in message
    assert str(expected.files[0]) in message
    assert expected.reason.value in message
    assert any(e.reason is expected.reason for e in raised.value.report)


def test_samples_lost_to_a_bad_history_frame_are_reported_one_by_one(dataset_copy: Path) -> None:
    truncated_png(dataset_copy)
    index = build_index(dataset_copy)
    bad_file = str(frame_png(dataset_copy, EP, 4))
    own = index.report.by_reason(Reason.UNREADABLE_IMAGE)
    assert [(e.file, e.sample_key) for e in own] == [(bad_file, f"{EP}/4")]
    followers = index.report.by_reason(Reason.BAD_WINDOW_FRAME)
    assert {e.sample_key for e in followers} == _WITH_FRAME_4 - {f"{EP}/4"}
    assert {e.file for e in followers} == {bad_file}
    assert index.summary().skipped == {"bad_window_frame": 6, "unreadable_image": 1}


def test_unusable_sources_fail_clearly(sample_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_index(tmp_path / "nowhere")
    with pytest.raises(DatasetError, match="single episode folder"):
        build_index(sample_dataset / EP)
    other = tmp_path / "data.csv"
    other.write_text("id\n")
    with pytest.raises(DatasetError, match="data.csv"):
        build_index(other)


# ---------------------------------------------------------------------------------------------
# Annotation files (JSON / JSONL, one record per sample)

_ALIAS_SETS = [
    ("instruction", "subinstruction", "2D_description", "3D_description", "action"),
    ("instruction_text", "sub_instruction", "2d_description", "3d_description", "action_label"),
    ("full_instruction", "sub_instruction_text", "description_2d", "description_3d", "action"),
]


def annotation_records(index: DatasetIndex) -> list[dict[str, Any]]:
    """One record per sample of a folder index, cycling through every field alias; every other
    record gives the action as its integer code."""
    records = []
    for sample in index.samples:
        instruction, sub, d2, d3, action = _ALIAS_SETS[sample.row % 3]
        records.append(
            {
                "id": sample.key,
                instruction: sample.instruction,
                sub: sample.subinstruction,
                d2: sample.description_2d,
                d3: sample.description_3d,
                action: sample.action_id if sample.row % 2 else sample.action,
                "images": [frame.relpath for frame in index.window(sample)],
            }
        )
    return records


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_jsonl_annotation_of_the_sample_data_gives_the_same_samples_and_frames(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    annotation = write_jsonl(tmp_path / "train.jsonl", annotation_records(sample_index))
    index = build_index(annotation, image_root=sample_dataset)
    assert index.report.entries == ()
    assert index.source_format == "annotations"
    assert index.samples == sample_index.samples
    assert index.frames == sample_index.frames
    assert [e.episode_id for e in index.episodes] == [e.episode_id for e in sample_index.episodes]
    assert index.summary().images_per_sample == 9


def test_a_json_list_annotation_next_to_its_images_reads_like_jsonl(
    dataset_copy: Path, sample_index: DatasetIndex
) -> None:
    records = annotation_records(sample_index)
    annotation = dataset_copy / "train.json"
    annotation.write_text(json.dumps(records, indent=1))
    index = build_index(annotation)  # image root defaults to the annotation's folder
    assert [s.key for s in index.samples] == [r["id"] for r in records]
    assert [s.action for s in index.samples] == [s.action for s in sample_index.samples]
    assert [s.window for s in index.samples] == [s.window for s in sample_index.samples]
    assert index.frames[0].path == dataset_copy / EP / sample_index.frames[0].path.name


def test_annotation_samples_keep_record_order_and_use_the_id_as_key(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    records = annotation_records(sample_index)[::-1]
    records[0]["id"] = 12345
    index = build_index(write_jsonl(tmp_path / "a.jsonl", records), image_root=sample_dataset)
    assert [s.key for s in index.samples] == [str(r["id"]) for r in records]
    assert index.sample("12345").step == SAMPLE_STEPS - 1


def test_annotation_windows_of_other_than_nine_images_are_reported_not_indexed(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    # A cache stores windows of history + 1 images: a record with 4 would fail the whole precompute.
    short, full = annotation_records(sample_index)[3:5]
    short["images"] = short["images"][-4:]  # frames 0, 1, 2, 3 of the episode, no padding
    annotation = write_jsonl(tmp_path / "a.jsonl", [short, full])
    index = build_index(annotation, image_root=sample_dataset)
    assert [s.key for s in index.samples] == [full["id"]]
    (entry,) = index.report.entries
    assert (entry.reason, entry.sample_key, entry.file, entry.line) == (Reason.WINDOW_LENGTH, short["id"],
                                                                        str(annotation), 1)
    assert "4 images; a window is history + 1 = 9" in entry.detail
    summary = index.summary()
    assert summary.images_per_sample == 9 and summary.window_lengths == {9: 1}


def test_annotation_texts_are_stripped_keep_inner_newlines_and_lists_give_their_first_element(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    record = annotation_records(sample_index)[0]
    (instruction, sub, d2, d3, _action) = _ALIAS_SETS[0]
    record.update({
        instruction: "  Walk to the kitchen.\nThen stop by the sink.\n",
        sub: ["\twalk to the kitchen ", "an alternative wording"],
        d2: "A door.\n\nA lamp.   ",
        d3: [" The door is 2 m ahead.\nThe lamp is left.\n"],
    })
    annotation = tmp_path / "train.jsonl"
    annotation.write_text(json.dumps(record) + "\n")
    (sample,) = build_index(annotation, image_root=sample_dataset, strict=True).samples
    assert sample.instruction == "Walk to the kitchen.\nThen stop by the sink."
    assert sample.subinstruction == "walk to the kitchen"
    assert sample.description_2d == "A door.\n\nA lamp."
    assert sample.description_3d == "The door is 2 m ahead.\nThe lamp is left."


@dataclass
class RecordDamage:
    reason: Reason
    file: Path | None = None  # default: the annotation file itself
    line: int | None = None


def _damage_record(name: str, record: dict[str, Any], root: Path, tmp_path: Path) -> RecordDamage | None:
    if name == "no_images_field":
        del record["images"]
        return RecordDamage(Reason.NO_IMAGES)
    if name == "empty_images":
        record["images"] = []
        return RecordDamage(Reason.NO_IMAGES)
    if name == "missing_image_path":
        record["images"][-2] = f"{EP}/step_0099_STOP.png"
        return RecordDamage(Reason.MISSING_IMAGE, root / EP / "step_0099_STOP.png")
    if name in ("short_window", "long_window"):
        record["images"] = record["images"][1:] if name == "short_window" else [record["images"][0]] + record["images"]
        return RecordDamage(Reason.WINDOW_LENGTH)
    if name == "unknown_action_code":
        record["action"] = 7
        return RecordDamage(Reason.UNKNOWN_ACTION)
    if name == "unknown_action_name":
        record.pop("action", None)
        record.pop("action_label", None)
        record["action_label"] = "FLY"
        return RecordDamage(Reason.UNKNOWN_ACTION)
    if name == "empty_description":
        for alias in ("3D_description", "3d_description", "description_3d"):
            record.pop(alias, None)
        record["3D_description"] = ""
        return RecordDamage(Reason.EMPTY_DESCRIPTION)
    if name == "no_instruction":
        for alias in ("instruction", "instruction_text", "full_instruction"):
            record.pop(alias, None)
        return RecordDamage(Reason.INVALID_RECORD)
    if name == "unreadable_image":
        broken = tmp_path / "broken.png"
        broken.write_bytes(Path(root / record["images"][-1]).read_bytes()[:3000])
        record["images"][-1] = str(broken)
        return RecordDamage(Reason.UNREADABLE_IMAGE, broken)
    return None


RECORD_DAMAGES = [
    "no_images_field",
    "empty_images",
    "short_window",
    "long_window",
    "missing_image_path",
    "unknown_action_code",
    "unknown_action_name",
    "empty_description",
    "no_instruction",
    "unreadable_image",
]


@pytest.mark.parametrize("name", RECORD_DAMAGES)
def test_bad_annotation_records_are_reported_with_file_and_line_and_skipped(
    name: str, sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    records = annotation_records(sample_index)[:6]
    expected = _damage_record(name, records[2], sample_dataset, tmp_path)
    assert expected is not None
    annotation = write_jsonl(tmp_path / "train.jsonl", records)
    index = build_index(annotation, image_root=sample_dataset)
    (entry,) = index.report.entries
    assert entry.reason is expected.reason
    assert entry.sample_key == records[2]["id"]
    if expected.file is None:
        assert (entry.file, entry.line) == (str(annotation), 3)
    else:
        assert entry.file == str(expected.file)
        assert f"{annotation}:3" in entry.detail
    assert [s.key for s in index.samples] == [r["id"] for i, r in enumerate(records) if i != 2]

    with pytest.raises(DatasetError) as raised:
        build_index(annotation, image_root=sample_dataset, strict=True)
    message = str(raised.value)
    assert expected.reason.value in message and records[2]["id"] in message
    assert (f"{annotation}:3" if expected.file is None else str(expected.file)) in message


def test_malformed_jsonl_lines_are_reported_with_their_line_number(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    lines = [json.dumps(r) for r in annotation_records(sample_index)[:4]]
    lines.insert(2, '{"id": "broken", "images": [')
    lines.insert(1, "")  # blank lines are allowed and still counted
    annotation = tmp_path / "train.jsonl"
    annotation.write_text("\n".join(lines) + "\n")
    index = build_index(annotation, image_root=sample_dataset)
    (entry,) = index.report.entries
    assert (entry.reason, entry.file, entry.line) == (Reason.MALFORMED_JSON, str(annotation), 4)
    assert len(index.samples) == 4
    with pytest.raises(DatasetError, match=rf"{annotation}:4"):
        build_index(annotation, image_root=sample_dataset, strict=True)


def test_a_malformed_json_annotation_file_is_reported_and_yields_no_samples(tmp_path: Path) -> None:
    annotation = tmp_path / "train.json"
    annotation.write_text('[\n  {"id": 1,\n  "images": ]\n')
    index = build_index(annotation)
    (entry,) = index.report.entries
    assert (entry.reason, entry.file, entry.line) == (Reason.MALFORMED_JSON, str(annotation), 3)
    assert index.samples == ()
    with pytest.raises(DatasetError, match="train.json:3"):
        build_index(annotation, strict=True)


def test_a_repeated_annotation_id_keeps_the_first_record_and_reports_the_rest(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    records = annotation_records(sample_index)[:3]
    records.append(dict(records[0], action="STOP"))
    annotation = write_jsonl(tmp_path / "train.jsonl", records)
    index = build_index(annotation, image_root=sample_dataset)
    (entry,) = index.report.entries
    assert (entry.reason, entry.line, entry.sample_key) == (Reason.DUPLICATE_ID, 4, records[0]["id"])
    assert index.sample(records[0]["id"]).action == sample_index.samples[0].action
    with pytest.raises(DatasetError, match="duplicate_id"):
        build_index(annotation, image_root=sample_dataset, strict=True)


def test_a_record_whose_images_span_two_episode_folders_is_rejected(
    sample_dataset: Path, sample_index: DatasetIndex, tmp_path: Path
) -> None:
    records = annotation_records(sample_index)[:2]
    records[1]["images"][0] = sample_index.frame(OTHER, 0).relpath
    index = build_index(write_jsonl(tmp_path / "a.jsonl", records), image_root=sample_dataset)
    assert [e.reason for e in index.report] == [Reason.MIXED_EPISODE_WINDOW]
    assert [s.key for s in index.samples] == [records[0]["id"]]


def test_a_far_off_step_number_is_one_report_entry_for_the_whole_hole(dataset_copy: Path) -> None:
    png = frame_png(dataset_copy, EP, 11)
    far = png.with_name(png.name.replace("step_0011", "step_0500"))
    png.rename(far)
    png.with_suffix(".json").rename(far.with_suffix(".json"))
    index = build_index(dataset_copy)
    (hole,) = index.report.by_reason(Reason.MISSING_STEP)
    assert (hole.file, hole.sample_key) == (str(dataset_copy / EP / "step_0011_*"), None)
    assert "11..499" in hole.detail
    assert [(e.reason, e.sample_key) for e in index.report] == [
        (Reason.MISSING_STEP, None),
        (Reason.BAD_WINDOW_FRAME, f"{EP}/500"),
    ]
    assert episode_keys(EP, range(11)) <= keys(index)
