"""`write_sample_data`: deterministic synthetic episodes whose pictures and texts follow the actions."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from janus_core.index import ACTIONS, build_index
from janus_core.sample_data import HEIGHT, WIDTH, write_sample_data

FRAME = re.compile(r"^step_(\d{4})_([A-Z_]+)\.png$")
AHEAD = re.compile(r"^The (.+?) is about ([\d.]+) m straight ahead\.")


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two 20-step episodes; seed 1 walks with left turns, right turns and forward runs."""
    return write_sample_data(tmp_path_factory.mktemp("walk") / "data", episodes=2, steps=20, seed=1)


def frames_of(episode: Path) -> list[tuple[Path, str]]:
    pngs = sorted(episode.glob("*.png"))
    return [(png, FRAME.match(png.name).group(2)) for png in pngs]  # type: ignore[union-attr]


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_writes_episode_folders_of_frames_descriptions_and_milestones(tmp_path: Path) -> None:
    root = write_sample_data(tmp_path / "out", episodes=2, steps=6, seed=3)
    assert root == tmp_path / "out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left behind
    assert sorted(p.name for p in root.iterdir()) == ["episode_0000", "episode_0001"]
    for episode in root.iterdir():
        names = sorted(p.name for p in episode.iterdir())
        pngs = [n for n in names if n.endswith(".png")]
        assert len(pngs) == 6 and len(names) == 13
        steps_actions = [FRAME.match(n).groups() for n in pngs]  # type: ignore[union-attr]
        assert [int(s) for s, _ in steps_actions] == list(range(6))
        actions = [a for _, a in steps_actions]
        assert set(actions) <= set(ACTIONS) and actions[-1] == "STOP" and "STOP" not in actions[:-1]
        for png in pngs:
            with Image.open(episode / png) as image:
                assert (
                    (image.format, image.mode, image.size)
                    == ("PNG", "RGB", (WIDTH, HEIGHT))
                    == ("PNG", "RGB", (640, 480))
                )
            texts = json.loads((episode / png).with_suffix(".json").read_text())
            assert texts["landmark_description"].strip() and texts["spatial_description"].strip()
        milestones = json.loads((episode / "milestones_result.json").read_text())
        subs = milestones["subinstructions"]
        checkpoints = [c["checkpoint_frame_index"] for c in milestones["completion_checkpoints"]]
        assert subs and all(s.strip() for s in subs)
        assert milestones["instruction_text"] == " ".join(subs)
        assert len(checkpoints) == len(subs) and checkpoints == sorted(set(checkpoints)) and checkpoints[-1] == 5


def test_the_same_seed_writes_byte_identical_files_and_another_seed_does_not(tmp_path: Path) -> None:
    def contents(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    first = contents(write_sample_data(tmp_path / "a", episodes=2, steps=4, seed=7))
    again = contents(write_sample_data(tmp_path / "b", episodes=2, steps=4, seed=7))
    other = contents(write_sample_data(tmp_path / "c", episodes=2, steps=4, seed=8))
    assert first == again
    assert first.keys() != other.keys() or any(first[k] != other[k] for k in first)


def test_an_episode_does_not_depend_on_how_many_episodes_are_written(tmp_path: Path) -> None:
    one = write_sample_data(tmp_path / "one", episodes=1, steps=3, seed=2) / "episode_0000"
    two = write_sample_data(tmp_path / "two", episodes=2, steps=3, seed=2) / "episode_0000"
    assert [(p.name, p.read_bytes()) for p in sorted(one.iterdir())] == [
        (p.name, p.read_bytes()) for p in sorted(two.iterdir())
    ]


def test_frames_are_varied_smooth_pictures_not_flat_colour_or_noise(walk: Path) -> None:
    colours = []
    for episode in sorted(walk.iterdir()):
        images = [pixels(png) for png, _ in frames_of(episode)]
        for image in images:
            packed = image.astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.uint32)
            colours.append(len(np.unique(packed)))
            # Rendered surfaces: most horizontal neighbours are close in colour (noise is not).
            step = np.abs(np.diff(image.astype(np.int16), axis=1)).max(axis=2)
            assert (step <= 12).mean() > 0.8
        for before, after in pairwise(images):
            assert np.abs(before.astype(np.int16) - after.astype(np.int16)).mean() > 3
    # Textures, shading and fog give hundreds of colours; even a wall seen from 0.5 m has dozens.
    assert min(colours) > 50 and np.median(colours) > 400


def _best_horizontal_shift(before: np.ndarray, after: np.ndarray) -> int:
    """Shift s (pixels) such that after[:, x] best matches before[:, x + s] around the horizon."""
    a = before[180:300].astype(np.float32)
    b = after[180:300].astype(np.float32)
    errors = {}
    for s in range(-320, 321, 4):
        if s >= 0:
            errors[s] = np.abs(b[:, : WIDTH - s] - a[:, s:]).mean()
        else:
            errors[s] = np.abs(b[:, -s:] - a[:, : WIDTH + s]).mean()
    return min(errors, key=errors.__getitem__)


def test_turning_rotates_the_view_by_thirty_degrees_in_the_named_direction(walk: Path) -> None:
    """With a 90-degree field of view, a 30-degree turn moves the scene by about 320*tan(30) = 185 px."""
    seen = set()
    for episode in sorted(walk.iterdir()):
        frames = frames_of(episode)
        for (png, action), (next_png, _) in pairwise(frames):
            if action in ("TURN_LEFT", "TURN_RIGHT"):
                shift = _best_horizontal_shift(pixels(png), pixels(next_png))
                expected_sign = 1 if action == "TURN_RIGHT" else -1
                assert shift * expected_sign > 0 and 100 <= abs(shift) <= 320, (png.name, shift)
                seen.add(action)
    assert seen == {"TURN_LEFT", "TURN_RIGHT"}


def test_moving_forward_brings_the_wall_ahead_half_a_metre_closer(walk: Path) -> None:
    checked = 0
    for episode in sorted(walk.iterdir()):
        frames = frames_of(episode)
        for (png, action), (next_png, _) in pairwise(frames):
            if action != "MOVE_FORWARD":
                continue
            now = AHEAD.match(json.loads(png.with_suffix(".json").read_text())["spatial_description"])
            then = AHEAD.match(json.loads(next_png.with_suffix(".json").read_text())["spatial_description"])
            assert now and then
            if now.group(1) == then.group(1):
                assert float(now.group(2)) - float(then.group(2)) == pytest.approx(0.5, abs=0.11)
                checked += 1
    assert checked >= 10


def test_milestones_split_the_walk_into_several_subinstructions(walk: Path) -> None:
    index = build_index(walk)
    assert index.report.entries == ()
    for episode in index.episodes:
        assert len(episode.subinstructions) >= 2
        assert len({s.subinstruction for s in index.samples_of(episode.episode_id)}) == len(episode.subinstructions)


def test_a_single_step_episode_is_one_stop_frame(tmp_path: Path) -> None:
    root = write_sample_data(tmp_path / "one", episodes=1, steps=1, seed=0)
    assert [p.name for p in sorted((root / "episode_0000").glob("*.png"))] == ["step_0000_STOP.png"]
    milestones = json.loads((root / "episode_0000" / "milestones_result.json").read_text())
    assert milestones["completion_checkpoints"] == [{"checkpoint_frame_index": 0}]


def test_refuses_to_write_into_a_non_empty_folder_and_rejects_empty_requests(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("user data")
    with pytest.raises(FileExistsError, match="not empty"):
        write_sample_data(tmp_path, episodes=1, steps=2, seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError):
        write_sample_data(tmp_path / "x", episodes=0, steps=2, seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_sample_data(empty, episodes=1, steps=2, seed=0) == empty
    assert (empty / "episode_0000" / "milestones_result.json").is_file()
