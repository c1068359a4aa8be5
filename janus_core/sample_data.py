"""Deterministic synthetic episodes in the episode-folder format (or as an annotation file), for demos
and tests.

Each episode is a walk through a small grid world of coloured rooms joined by corridors with
wooden door frames. Frames are 640x480 RGB PNGs ray-cast from the agent's pose (textured brick
walls, tiled floors, ceiling lamps, distance fog), so every frame shows what the actions imply:
``MOVE_FORWARD`` moves the camera 0.5 m, ``TURN_LEFT`` / ``TURN_RIGHT`` rotate it by 30 degrees,
and the last action is ``STOP``. The texts are derived from the same scene: the instruction and
subinstructions from the action runs (with checkpoints at the end of each), and each frame's 2-D
(landmark) and 3-D (spatial) descriptions from what the rays hit.

Everything is numpy-vectorised over pixels, and episode ``i`` depends only on ``(seed, i)``, so
the same arguments write byte-identical files (PNG compression settings are fixed; a different
zlib build could still compress differently, the pixels stay the same).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
from PIL import Image

from janus_core.index import ACTIONS, LANDMARK_FIELD, MILESTONES_FILE, SPATIAL_FIELD, build_index
from janus_core.system.files import atomic_directory

WIDTH = 640
HEIGHT = 480
PNG_COMPRESS_LEVEL = 1  # fixed so that files are byte-identical run to run; 1 is 2-3x faster than 6

_GRID = 18
_FOV_DEG = 90.0  # horizontal field of view, as in the VLN-CE simulator setup
_CAMERA_HEIGHT = 1.25  # metres; one grid cell is one metre
_WALL_HEIGHT = 2.5
_FORWARD = 0.5  # metres per MOVE_FORWARD
_TURN_UNITS = 12  # headings are multiples of 360/12 = 30 degrees
_FOG = np.array([0.80, 0.82, 0.86], dtype=np.float32)

_STOP, _FORWARD_ACTION, _LEFT, _RIGHT = ACTIONS

# Wall materials: 0 is free space, then corridor, wood (door trim), and one colour per room.
_FREE, _CORRIDOR, _DOOR = 0, 1, 2
_ROOM_COLOURS: tuple[tuple[str, tuple[float, float, float]], ...] = (
    ("red", (0.72, 0.20, 0.18)),
    ("blue", (0.20, 0.34, 0.74)),
    ("green", (0.22, 0.58, 0.28)),
    ("yellow", (0.88, 0.76, 0.26)),
    ("purple", (0.50, 0.28, 0.66)),
    ("orange", (0.90, 0.50, 0.18)),
    ("teal", (0.16, 0.58, 0.60)),
    ("pink", (0.88, 0.48, 0.60)),
)
_CORRIDOR_COLOUR = (0.56, 0.56, 0.54)
_DOOR_COLOUR = (0.48, 0.30, 0.14)


@dataclass(frozen=True)
class _World:
    walls: np.ndarray  # int [G, G]: material per cell, 0 = free
    doors: np.ndarray  # bool [G, G]: wall cells that frame a doorway
    rooms: np.ndarray  # int [G, G]: room number per free cell, -1 = corridor / wall
    centres: tuple[tuple[int, int], ...]  # (x, y) cell of each room's centre
    names: tuple[str, ...]  # material names, indexed by material
    palette: np.ndarray  # float32 [P, 3]: wall materials, floors (per room, then corridor), extras
    n_rooms: int

    # Palette entries after the wall materials.
    @property
    def first_floor(self) -> int:
        return len(self.names)

    @property
    def mortar(self) -> int:
        return len(self.names) + self.n_rooms + 1

    @property
    def ceiling(self) -> int:
        return self.mortar + 1

    @property
    def lamp(self) -> int:
        return self.mortar + 2


@dataclass(frozen=True)
class _Pose:
    x: float
    y: float
    heading: int  # in units of 30 degrees; 0 faces +x, increasing turns right (y grows downwards)

    @property
    def direction(self) -> np.ndarray:
        """Unit heading vector; exact zeros for axis headings, so that rays along an axis never
        step sideways through a grid line the camera stands on (cos(pi/2) is 6e-17, not 0)."""
        angle = self.heading * 2.0 * np.pi / _TURN_UNITS
        d = np.array([np.cos(angle), np.sin(angle)])
        return np.where(np.abs(d) < 1e-12, 0.0, d)


SAMPLE_FORMATS = ("folders", "jsonl")
"""The input formats the sample data can be written in: episode folders, or an annotation file."""
ANNOTATION_FILE = "annotations.jsonl"
"""The annotation file of the ``jsonl`` form, beside the episodes' images."""


def write_sample_data(out: Path, episodes: int, steps: int, seed: int, form: str = "folders") -> Path:
    """Write ``episodes`` episodes of ``steps`` frames each under ``out``; returns ``out``.

    ``form``: ``folders`` (the episode-folder format) or ``jsonl``: the same images, and instead of
    the per-frame and per-episode JSON files one annotation file ``out/annotations.jsonl`` with a
    record per sample (its window of the default history, as the episode folders index), so the two
    forms make the same samples. ``out`` must not exist or be empty. Files are written into a
    temporary sibling folder that is renamed into place at the end, so an interrupted run leaves no
    half-written dataset.
    """
    out = Path(out)
    if episodes < 1 or steps < 1:
        raise ValueError(f"need at least one episode and one step, got episodes={episodes} steps={steps}")
    if form not in SAMPLE_FORMATS:
        raise ValueError(f"form must be one of {', '.join(SAMPLE_FORMATS)}, got {form!r}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not empty")
    with atomic_directory(out) as staging:
        for number in range(episodes):
            _write_episode(staging / f"episode_{number:04d}", np.random.default_rng([seed, number]), steps)
        if form == "jsonl":
            _as_annotation_file(staging)
    return out


def _as_annotation_file(root: Path) -> None:
    """Replace the episode folders' JSON files under ``root`` by one annotation file of their samples."""
    index = build_index(root)
    records = [{"id": sample.key, "instruction": sample.instruction, "subinstruction": sample.subinstruction,
                "2D_description": sample.description_2d, "3D_description": sample.description_3d,
                "action": sample.action, "images": [frame.relpath for frame in index.window(sample)]}
               for sample in index.samples]
    (root / ANNOTATION_FILE).write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    for text in root.glob("*/*.json"):
        text.unlink()


def _write_episode(folder: Path, rng: np.random.Generator, steps: int) -> None:
    world = _make_world(rng)
    poses, actions = _walk(world, rng, steps)
    subinstructions, checkpoints = _instructions(world, poses, actions)
    folder.mkdir()
    milestones = {
        "instruction_text": " ".join(subinstructions),
        "subinstructions": subinstructions,
        "completion_checkpoints": [{"checkpoint_frame_index": c} for c in checkpoints],
    }
    (folder / MILESTONES_FILE).write_text(json.dumps(milestones, indent=2) + "\n", encoding="utf-8")
    for step, (pose, action) in enumerate(zip(poses, actions, strict=True)):
        stem = f"step_{step:04d}_{action}"
        pixels, view = _render(world, pose)
        Image.fromarray(pixels, "RGB").save(folder / f"{stem}.png", format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        texts = {LANDMARK_FIELD: _landmark_text(world, view), SPATIAL_FIELD: _spatial_text(world, pose, view)}
        (folder / f"{stem}.json").write_text(json.dumps(texts, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# World and walk


def _make_world(rng: np.random.Generator) -> _World:
    free = np.zeros((_GRID, _GRID), dtype=bool)
    rooms = np.full((_GRID, _GRID), -1, dtype=np.int64)
    boxes: list[tuple[int, int, int, int]] = []
    for _attempt in range(200):
        if len(boxes) == 5:
            break
        w, h = (int(v) for v in rng.integers(3, 6, size=2))
        x0, y0 = int(rng.integers(1, _GRID - w)), int(rng.integers(1, _GRID - h))
        # At least two wall cells between rooms, so that each room has its own coloured walls.
        if any(
            x0 <= bx + bw + 1 and bx <= x0 + w + 1 and y0 <= by + bh + 1 and by <= y0 + h + 1
            for bx, by, bw, bh in boxes
        ):
            continue
        boxes.append((x0, y0, w, h))
    for number, (x0, y0, w, h) in enumerate(boxes):
        free[y0 : y0 + h, x0 : x0 + w] = True
        rooms[y0 : y0 + h, x0 : x0 + w] = number
    centres = tuple((x0 + w // 2, y0 + h // 2) for x0, y0, w, h in boxes)
    for (ax, ay), (bx, by) in pairwise(centres):
        # L-shaped corridor; which leg comes first varies per corridor.
        corner = (bx, ay) if rng.random() < 0.5 else (ax, by)
        for (sx, sy), (ex, ey) in (((ax, ay), corner), (corner, (bx, by))):
            free[min(sy, ey) : max(sy, ey) + 1, min(sx, ex) : max(sx, ex) + 1] = True

    colour_order = rng.permutation(len(_ROOM_COLOURS))[: len(boxes)]
    names = ("free", "grey", "wooden") + tuple(_ROOM_COLOURS[i][0] for i in colour_order)
    colours = np.array(
        [(0.0, 0.0, 0.0), _CORRIDOR_COLOUR, _DOOR_COLOUR] + [_ROOM_COLOURS[i][1] for i in colour_order],
        dtype=np.float32,
    )
    # A wall takes the colour of a room it touches (8-neighbourhood), else the corridor grey;
    # a wall beside a doorway (a corridor cell next to a room) is a door frame with wooden trim.
    walls = np.where(free, _FREE, _CORRIDOR).astype(np.int64)
    padded_rooms = np.pad(rooms, 1, constant_values=-1)
    room_next = np.full((_GRID, _GRID), -1, dtype=np.int64)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            shifted = padded_rooms[1 + dy : 1 + dy + _GRID, 1 + dx : 1 + dx + _GRID]
            room_next = np.where((room_next < 0) & (shifted >= 0), shifted, room_next)
    walls = np.where(~free & (room_next >= 0), 3 + room_next, walls)
    corridor = free & (rooms < 0)
    doorway = np.zeros_like(free)
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        doorway |= corridor & (padded_rooms[1 + dy : 1 + dy + _GRID, 1 + dx : 1 + dx + _GRID] >= 0)
    padded_door = np.pad(doorway, 1, constant_values=False)
    beside_door = np.zeros_like(free)
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        beside_door |= padded_door[1 + dy : 1 + dy + _GRID, 1 + dx : 1 + dx + _GRID]
    doors = ~free & beside_door

    beige = np.array([0.86, 0.80, 0.70], dtype=np.float32)
    floors = 0.35 * colours[3:] + 0.65 * beige
    # Corridor floor, mortar, ceiling, lamp: the order that _World's palette properties assume.
    extras = [(0.50, 0.50, 0.50), (0.78, 0.78, 0.76), (0.90, 0.88, 0.82), (1.0, 1.0, 1.0)]
    palette = np.concatenate([colours, floors, np.array(extras, dtype=np.float32)]).astype(np.float32)
    return _World(walls, doors, rooms, centres, names, palette, len(boxes))


def _shortest_path(walls: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[tuple[int, int]]:
    """Cells from start (exclusive) to goal (inclusive), breadth-first over free cells."""
    previous: dict[tuple[int, int], tuple[int, int]] = {start: start}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        x, y = cell
        for nx, ny in ((x + 1, y), (x, y + 1), (x - 1, y), (x, y - 1)):
            if walls[ny, nx] == _FREE and (nx, ny) not in previous:
                previous[(nx, ny)] = cell
                queue.append((nx, ny))
    path = [goal]
    while path[-1] != start:
        path.append(previous[path[-1]])
    return path[::-1][1:]


_AXIS_HEADINGS = {(1, 0): 0, (0, 1): 3, (-1, 0): 6, (0, -1): 9}  # grid step -> heading


def _walk(world: _World, rng: np.random.Generator, steps: int) -> tuple[list[_Pose], list[str]]:
    """Poses and actions of a walk from room 0 through the rooms in turn; the last action is STOP."""
    cx, cy = world.centres[0]
    cell = (cx, cy)
    target = 1 % len(world.centres)
    # Start facing roughly along the way to the next room (up to 90 degrees off), so that short
    # episodes move as well as turn.
    heading = int(rng.integers(0, _TURN_UNITS))
    if target != 0:
        nx, ny = _shortest_path(world.walls, cell, world.centres[target])[0]
        heading = (_AXIS_HEADINGS[(nx - cx, ny - cy)] + int(rng.integers(-3, 4))) % _TURN_UNITS
    pose = _Pose(float(cx) + 0.5, float(cy) + 0.5, heading)
    poses: list[_Pose] = []
    actions: list[str] = []

    def act(action: str) -> bool:
        nonlocal pose
        poses.append(pose)
        actions.append(action)
        if action == _RIGHT:
            pose = _Pose(pose.x, pose.y, (pose.heading + 1) % _TURN_UNITS)
        elif action == _LEFT:
            pose = _Pose(pose.x, pose.y, (pose.heading - 1) % _TURN_UNITS)
        elif action == _FORWARD_ACTION:
            dx, dy = pose.direction
            pose = _Pose(pose.x + _FORWARD * float(dx), pose.y + _FORWARD * float(dy), pose.heading)
        return len(actions) < steps - 1

    going = steps > 1
    while going:
        goal = world.centres[target]
        if goal == cell:  # a single-room world: turn on the spot
            going = act(_RIGHT)
            continue
        for nx, ny in _shortest_path(world.walls, cell, goal):
            wanted = _AXIS_HEADINGS[(nx - cell[0], ny - cell[1])]
            diff = (wanted - pose.heading) % _TURN_UNITS
            turn = _RIGHT if diff < 6 or (diff == 6 and rng.random() < 0.5) else _LEFT
            while going and pose.heading != wanted:
                going = act(turn)
            for _ in range(round(1.0 / _FORWARD)):
                if going:
                    going = act(_FORWARD_ACTION)
            if not going:
                break
            cell = (nx, ny)
            # Snap to the cell centre so that float drift never accumulates.
            pose = _Pose(nx + 0.5, ny + 0.5, pose.heading)
        target = (target + 1) % len(world.centres)
    poses.append(pose)
    actions.append(_STOP)
    return poses, actions


def _instructions(world: _World, poses: list[_Pose], actions: list[str]) -> tuple[list[str], list[int]]:
    """Subinstructions and the frame at which each completes.

    The walk (STOP excluded) is cut into runs of one action; forward runs are also cut where the
    agent leaves a room or corridor. A subinstruction is a turn run followed by a forward run,
    or a lone run; its checkpoint is the frame of its last action.
    """
    runs: list[tuple[str, int, int, int]] = []  # (action, region, first step, last step)
    for step, action in enumerate(actions[:-1]):
        region = _region(world, poses[step]) if action == _FORWARD_ACTION else -2
        if runs and runs[-1][:2] == (action, region):
            runs[-1] = (action, region, runs[-1][2], step)
        else:
            runs.append((action, region, step, step))
    groups: list[list[tuple[str, int, int, int]]] = []
    for run in runs:
        if groups and len(groups[-1]) == 1 and groups[-1][0][0] in (_LEFT, _RIGHT) and run[0] == _FORWARD_ACTION:
            groups[-1].append(run)
        else:
            groups.append([run])
    texts: list[str] = []
    checkpoints: list[int] = []
    for group in groups:
        parts = [_run_text(world, poses, *run) for run in group]
        sentence = " and ".join(parts)
        texts.append(sentence[0].upper() + sentence[1:] + ".")
        checkpoints.append(group[-1][3])
    if texts:
        texts[-1] = texts[-1][:-1] + ", then stop."
        checkpoints[-1] = len(actions) - 1
    else:
        texts.append(f"Stop where you are, {_region_name(world, _region(world, poses[-1]), 'in')}.")
        checkpoints.append(len(actions) - 1)
    return texts, checkpoints


def _run_text(world: _World, poses: list[_Pose], action: str, region: int, first: int, last: int) -> str:
    count = last - first + 1
    if action != _FORWARD_ACTION:
        degrees = count * 360 // _TURN_UNITS
        side = "left" if action == _LEFT else "right"
        return "turn around" if degrees == 180 else f"turn {side} about {degrees} degrees"
    where = "along the corridor" if region < 0 else f"through the {world.names[3 + region]} room"
    text = f"walk forward about {count * _FORWARD:g} m {where}"
    after = _region(world, poses[last + 1])
    if after != region:
        text += " and out into the corridor" if after < 0 else f" into the {world.names[3 + after]} room"
    return text


def _region(world: _World, pose: _Pose) -> int:
    """The room the pose is in, -1 for a corridor."""
    return int(world.rooms[int(pose.y), int(pose.x)])


def _region_name(world: _World, region: int, preposition: str) -> str:
    return "in the corridor" if region < 0 else f"{preposition} the {world.names[3 + region]} room"


# ---------------------------------------------------------------------------------------------
# Rendering


@dataclass(frozen=True)
class _View:
    """What the rays of one frame hit: per column distance, material and side."""

    distance: np.ndarray  # float32 [W]
    material: np.ndarray  # int [W]
    door: np.ndarray  # bool [W]: the column shows a doorway's frame
    floor_room: int  # room under the centre of the view, -1 for corridor
    left: float  # distance to the wall straight to the left / right
    right: float


def _cast(walls: np.ndarray, x: float, y: float, dx: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """Grid ray casting (DDA) for many rays at once: perpendicular distance, side, hit cell."""
    n = dx.shape[0]
    map_x = np.full(n, int(x), dtype=np.int64)
    map_y = np.full(n, int(y), dtype=np.int64)
    # An axis-parallel ray never crosses the other axis's grid lines: infinite step (the 0 * inf
    # of the branch np.where discards is harmless).
    with np.errstate(divide="ignore", invalid="ignore"):
        delta_x = np.where(dx == 0, np.inf, np.abs(1.0 / dx))
        delta_y = np.where(dy == 0, np.inf, np.abs(1.0 / dy))
        side_x = np.where(dx < 0, (x - map_x) * delta_x, (map_x + 1.0 - x) * delta_x)
        side_y = np.where(dy < 0, (y - map_y) * delta_y, (map_y + 1.0 - y) * delta_y)
    step_x = np.where(dx < 0, -1, 1)
    step_y = np.where(dy < 0, -1, 1)
    side = np.zeros(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    for _ in range(4 * _GRID):
        if not active.any():
            break
        go_x = active & (side_x < side_y)
        go_y = active & ~go_x
        map_x = np.where(go_x, map_x + step_x, map_x)
        side_x = np.where(go_x, side_x + delta_x, side_x)
        map_y = np.where(go_y, map_y + step_y, map_y)
        side_y = np.where(go_y, side_y + delta_y, side_y)
        side = np.where(go_x, 0, np.where(go_y, 1, side))
        active &= walls[map_y, map_x] == _FREE
    with np.errstate(invalid="ignore"):  # inf - inf in the discarded branch of axis-parallel rays
        distance = np.where(side == 0, side_x - delta_x, side_y - delta_y)
    return np.maximum(distance, 1e-3), side, map_x, map_y


def _hash01(*keys: np.ndarray) -> np.ndarray:
    """Deterministic pseudo-random value in [0, 1) per tuple of integers (exact integer math)."""
    h = np.zeros(keys[0].shape, dtype=np.int64)
    for key, prime in zip(keys, (73856093, 19349663, 83492791), strict=False):
        h ^= key * prime
    h = (h * 2654435761) & 0xFFFFFFFF
    return ((h >> 16) & 0xFF).astype(np.float32) / np.float32(256.0)


def _render(world: _World, pose: _Pose) -> tuple[np.ndarray, _View]:
    focal = float((WIDTH / 2) / np.tan(np.radians(_FOV_DEG) / 2))
    direction = pose.direction
    right = np.array([-direction[1], direction[0]]) * np.tan(np.radians(_FOV_DEG) / 2)
    cam = 2.0 * (np.arange(WIDTH) + 0.5) / WIDTH - 1.0
    ray_x = direction[0] + right[0] * cam
    ray_y = direction[1] + right[1] * cam
    distance, side, hit_x, hit_y = _cast(world.walls, pose.x, pose.y, ray_x, ray_y)
    material = world.walls[hit_y, hit_x]
    # Coordinate along the wall in metres, continuous across cells so that bricks line up.
    along = np.where(side == 0, pose.y + distance * ray_y, pose.x + distance * ray_x).astype(np.float32)[None, :]

    # Each pixel gets a palette entry and a brightness; colours are gathered once at the end.
    rows = (np.arange(HEIGHT, dtype=np.float32) + 0.5 - HEIGHT / 2)[:, None]  # [H, 1], never 0
    dist = distance.astype(np.float32)[None, :]
    height = _CAMERA_HEIGHT - rows * (dist / np.float32(focal))  # height on the wall seen by each pixel
    is_wall = (height >= 0) & (height <= _WALL_HEIGHT)

    # Walls: brick courses 0.25 m high and 0.5 m long, offset every other course, a tint per
    # brick; door frames get wooden trim (planks with a wavy grain) along their edges; y-facing
    # walls are darker.
    course_f = np.clip(height * 4.0, -1.0, _WALL_HEIGHT * 4.0)
    course = np.floor(course_f)
    courses = course.astype(np.int64)
    offset = (courses & 1).astype(np.float32) * 0.5 + along * 2.0  # in brick lengths
    brick = np.floor(offset)
    mortar = (course_f - course < 0.07) | (offset - brick < 0.035)
    tint = _hash01(courses, brick.astype(np.int64), np.broadcast_to(side, brick.shape))
    door_cell = world.doors[hit_y, hit_x]
    edge = along - np.floor(along)
    door = door_cell[None, :] & ((edge < 0.2) | (edge > 0.8))
    plank_f = along * 8.0  # 0.125 m planks, each with its own tint, and a dark seam between
    plank = np.floor(plank_f)
    plank_tint = _hash01(plank.astype(np.int64), np.broadcast_to(side, plank.shape) + 7)
    grain = (0.84 + 0.3 * plank_tint) * (1.0 + 0.1 * np.sin(along * 90.0 + 3.0 * np.sin(height * 6.0)))
    grain = np.where(plank_f - plank < 0.06, np.float32(0.55), grain)
    wall_shade = np.where(door, grain, np.where(mortar, np.float32(1.0), 0.88 + 0.24 * tint))
    wall_shade *= np.where(side == 1, np.float32(0.78), np.float32(1.0))[None, :]
    wall_entry = np.where(door, _DOOR, np.where(mortar, world.mortar, material[None, :]))

    # Floor and ceiling: where the pixel's ray meets the plane z = 0 or z = wall height.
    # The top half of the image can only show ceiling, the bottom half only floor.
    half = HEIGHT // 2
    plane = np.concatenate([(_WALL_HEIGHT - _CAMERA_HEIGHT) / -rows[:half], _CAMERA_HEIGHT / rows[half:]])
    plane *= np.float32(focal)
    world_x = pose.x + plane * ray_x[None, :].astype(np.float32)
    world_y = pose.y + plane * ray_y[None, :].astype(np.float32)
    lamp = (np.abs(world_x[:half] - np.floor(world_x[:half]) - 0.5) < 0.16) & (
        np.abs(world_y[:half] - np.floor(world_y[:half]) - 0.5) < 0.16
    )
    tile_x, tile_y = world_x[half:] * 2.0, world_y[half:] * 2.0  # 0.5 m tiles
    cell_x, cell_y = np.floor(tile_x), np.floor(tile_y)
    room = world.rooms[
        np.clip(world_y[half:].astype(np.int64), 0, _GRID - 1), np.clip(world_x[half:].astype(np.int64), 0, _GRID - 1)
    ]
    grout = (tile_x - cell_x < 0.05) | (tile_y - cell_y < 0.05)
    checker = (cell_x.astype(np.int64) + cell_y.astype(np.int64)) & 1
    flat_entry = np.concatenate(
        [np.where(lamp, world.lamp, world.ceiling), world.first_floor + np.where(room >= 0, room, world.n_rooms)]
    )
    flat_shade = np.concatenate(
        [
            np.ones_like(lamp, dtype=np.float32),
            np.where(grout, np.float32(0.6), 0.86 + 0.14 * checker.astype(np.float32)),
        ]
    )

    entry = np.where(is_wall, wall_entry, flat_entry)
    fog = np.exp(-0.09 * np.where(is_wall, dist, plane))
    shade = np.where(is_wall, wall_shade, flat_shade) * fog
    rgb = world.palette[entry] * shade[..., None] + _FOG * (1.0 - fog)[..., None]
    pixels = (np.minimum(rgb, 1.0) * 255.0 + 0.5).astype(np.uint8)

    # Straight left and straight right of the heading (y grows downwards, so right = (-dy, dx)).
    side_x = np.array([direction[1], -direction[1]])
    side_y = np.array([-direction[0], direction[0]])
    side_dist, _s, _x, _y = _cast(world.walls, pose.x, pose.y, side_x, side_y)
    floor_room = int(world.rooms[int(pose.y), int(pose.x)])
    view = _View(distance.astype(np.float32), material, door_cell, floor_room, float(side_dist[0]), float(side_dist[1]))
    return pixels, view


def _landmark_text(world: _World, view: _View) -> str:
    """2-D description: which walls and features are where in the image."""
    centre = int(view.material[WIDTH // 2])
    shares = np.bincount(view.material, minlength=len(world.names)) / WIDTH
    others = [world.names[m] for m in np.argsort(-shares, kind="stable") if m != centre and shares[m] >= 0.1]
    kind = f"{world.names[centre]} brick wall"
    text = f"A {kind} fills the middle of the view"
    if others:
        text += f", with {' and '.join(others)} walls to the sides"
    doors = np.flatnonzero(view.door)
    if doors.size:
        text += f"; a doorway with a wooden frame is visible {_third(float(doors.mean()))}"
    floor = f"{world.names[3 + view.floor_room]}-tinted tiles" if view.floor_room >= 0 else "grey corridor tiles"
    return text + f". The floor has {floor} and square lamps light the ceiling."


def _spatial_text(world: _World, pose: _Pose, view: _View) -> str:
    """3-D description: distances to what surrounds the camera."""
    centre = int(view.material[WIDTH // 2])
    ahead = float(view.distance[WIDTH // 2])
    text = f"The {world.names[centre]} wall is about {ahead:.1f} m straight ahead."
    text += f" The nearest wall to the left is {view.left:.1f} m away and to the right {view.right:.1f} m."
    doors = np.flatnonzero(view.door)
    if doors.size:
        nearest = int(doors[np.argmin(view.distance[doors])])
        text += f" A doorway is about {float(view.distance[nearest]):.1f} m away {_third(float(nearest))}."
    if view.floor_room >= 0:
        text += f" The camera stands inside the {world.names[3 + view.floor_room]} room."
    else:
        text += " The camera stands in a corridor."
    return text


def _third(column: float) -> str:
    if column < WIDTH / 3:
        return "on the left"
    return "on the right" if column >= 2 * WIDTH / 3 else "in the centre"
