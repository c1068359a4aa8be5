"""Input format 1, episode folders: ``<root>/<episode_id>/milestones_result.json`` plus
``step_<n>_<ACTION>.<png|jpg|jpeg>`` frames, each with a ``.json`` of the same stem holding
``landmark_description`` (2-D) and ``spatial_description`` (3-D).

* Episodes are the sub-folders of the root in code-point order of their names; hidden folders and
  plain files at the root are ignored; a symbolic-link loop (``x -> x``, ``episode -> ..``) is
  reported and skipped. Frames are ordered by their numeric step.
* A frame's ``index`` (the id that windows use) is its step number. Steps must run 0..n-1 without
  holes: a missing step, like an unreadable image or two files with the same step, makes that
  frame unusable, and every sample whose window contains it is skipped and reported. (The
  reference code used the position in the sorted file list, which silently shifts every later
  window when a frame is lost; we refuse to build such windows instead.)
* A frame whose description JSON is missing or empty, or whose action is unknown, is not a
  sample, but its pixels are fine, so it stays a history frame of later samples.
* Texts are normalised by :func:`janus_core.index.texts.normalise_text`; the subinstruction of a
  frame follows the chosen rule of :mod:`janus_core.index.subinstructions` (checkpoints sorted).
* Sample key: ``"<episode_id>/<step>"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from janus_core.index.files import (
    FRAME_NAME,
    FRAME_STEM,
    IMAGE_SUFFIXES,
    Builder,
    ImageInfo,
    Problem,
    link_loop,
    read_json,
)
from janus_core.index.model import ACTIONS, DatasetIndex, Episode, Frame, Sample
from janus_core.index.problems import Reason
from janus_core.index.subinstructions import subinstruction_for
from janus_core.index.texts import normalise_text
from janus_core.windows import window_frames

MILESTONES_FILE = "milestones_result.json"
LANDMARK_FIELD = "landmark_description"
SPATIAL_FIELD = "spatial_description"
CHUNK_EPISODES = 256
"""Episode folders indexed at a time: a stored index is written a chunk at a time, so a 612k-sample
dataset's rows are never all in memory (~10k frames a chunk at 40 frames an episode)."""


@dataclass
class _FrameFile:
    path: Path
    step: int
    action: str | None
    action_text: str


@dataclass
class _EpisodeScan:
    episode_id: str
    path: Path
    instruction: str
    subinstructions: tuple[str, ...]
    checkpoints: tuple[int, ...]
    by_step: dict[int, list[_FrameFile]]
    orphan_json: list[Path]


class EpisodeFolderBuilder(Builder):
    def __init__(self, root: Path, history: int, check_images: bool, threads: int, subinstruction_rule: str) -> None:
        super().__init__(history, check_images, threads, subinstruction_rule)
        self.root = root

    def build(self) -> DatasetIndex:
        episodes: list[Episode] = []
        frames: list[Frame] = []
        samples: list[Sample] = []
        for chunk_episodes, chunk_frames, chunk_samples in self.build_chunks():
            episodes += chunk_episodes
            frames += chunk_frames
            samples += chunk_samples
        return self.index_of(tuple(episodes), tuple(frames), tuple(samples))

    def index_of(self, episodes: tuple[Episode, ...], frames: tuple[Frame, ...] = (),
                 samples: tuple[Sample, ...] = ()) -> DatasetIndex:
        """The index of these rows (after :meth:`build_chunks`: its report is complete)."""
        return DatasetIndex(
            source=self.root,
            source_format="episodes",
            history=self.history,
            episodes=episodes,
            frames=frames,
            samples=samples,
            report=self.collected(),
            subinstruction_rule=self.subinstruction_rule,
        )

    def build_chunks(self, episodes_per_chunk: int | None = None
                     ) -> Iterator[tuple[list[Episode], list[Frame], list[Sample]]]:
        """The index's episodes, frames and samples, in order, a chunk of episode folders at a
        time (rows numbered over the whole index): what a stored index is written from, so that
        the rows of a 612k-sample dataset are never all in memory (:class:`~janus_core.index.
        columns.ColumnWriter`). The report is complete once the last chunk is taken."""
        folders = self._episode_folders()
        episodes_per_chunk = episodes_per_chunk or CHUNK_EPISODES
        n_frames = n_samples = 0
        for first in range(0, len(folders), episodes_per_chunk):
            scans = [scan for name in folders[first:first + episodes_per_chunk]
                     if (scan := self._scan_episode(name)) is not None]
            # One flat list of per-frame jobs over the chunk's episodes keeps the thread pool busy.
            jobs: list[_FrameFile] = [f for scan in scans for files in scan.by_step.values() for f in files]
            checked = self.map(
                lambda job: (
                    self.inspect(job.path),
                    _read_descriptions(job.path.with_suffix(".json")),
                ),
                jobs,
            )
            per_file = {job.path: result for job, result in zip(jobs, checked, strict=True)}
            episodes: list[Episode] = []
            frames: list[Frame] = []
            samples: list[Sample] = []
            for scan in scans:
                episode = self._assemble(scan, per_file, frames, samples, n_frames, n_samples)
                if episode is not None:
                    episodes.append(episode)
            n_frames += len(frames)
            n_samples += len(samples)
            yield episodes, frames, samples

    def _episode_folders(self) -> list[str]:
        """The root's non-hidden folders, by name; a symbolic-link loop among them is reported, not entered."""
        with os.scandir(self.root) as scan:
            entries = sorted((e for e in scan if not e.name.startswith(".")), key=lambda e: e.name)
        folders = []
        for entry in entries:
            loop = link_loop(entry.path) if entry.is_symlink() else None
            if loop is not None:
                self.report(entry.path, Reason.SYMLINK_LOOP, detail=f"{loop}; skipped")
            elif entry.is_dir():
                folders.append(entry.name)
        return folders

    def _scan_episode(self, episode_id: str) -> _EpisodeScan | None:
        folder = self.root / episode_id
        milestones = folder / MILESTONES_FILE
        if not milestones.is_file():
            loop = link_loop(milestones)
            reason = Reason.MISSING_MILESTONES if loop is None else Reason.SYMLINK_LOOP
            self.report(milestones, reason, detail=f"{loop + '; ' if loop else ''}episode {episode_id} skipped")
            return None
        data, problem = read_json(milestones)
        if problem is not None:
            self.report(milestones, problem.reason, detail=f"{problem.detail}; episode {episode_id} skipped")
            return None
        texts = _parse_milestones(data)
        if isinstance(texts, str):
            self.report(milestones, Reason.INVALID_MILESTONES, detail=f"{texts}; episode {episode_id} skipped")
            return None
        instruction, subinstructions, checkpoints = texts

        by_step: dict[int, list[_FrameFile]] = {}
        stems: set[str] = set()
        jsons: list[str] = []
        for name in sorted(os.listdir(folder)):
            suffix = os.path.splitext(name)[1].lower()
            if not name.startswith("step_"):
                continue
            if suffix == ".json":
                jsons.append(name)
                continue
            if suffix not in IMAGE_SUFFIXES:
                continue
            match = FRAME_NAME.match(name)
            if match is None:
                self.report(folder / name, Reason.BAD_FRAME_NAME, detail="expected step_<int>_<ACTION>.<png|jpg|jpeg>")
                continue
            step, action_text = int(match.group(1)), match.group(2)
            action = action_text if action_text in ACTIONS else None
            by_step.setdefault(step, []).append(_FrameFile(folder / name, step, action, action_text))
            stems.add(os.path.splitext(name)[0])
        orphans = [folder / name for name in jsons if os.path.splitext(name)[0] not in stems]
        return _EpisodeScan(
            episode_id, folder, instruction, subinstructions, checkpoints, dict(sorted(by_step.items())), orphans
        )

    def _assemble(
        self,
        scan: _EpisodeScan,
        per_file: Mapping[Path, tuple[ImageInfo | Problem, _Descriptions | Problem]],
        frames: list[Frame],
        samples: list[Sample],
        frame_base: int = 0,
        sample_base: int = 0,
    ) -> Episode | None:
        """One episode's rows appended to ``frames`` / ``samples`` (rows before them in the index:
        ``frame_base`` / ``sample_base``), and the episode; None when it has no usable frame."""
        ep = scan.episode_id
        if not scan.by_step:
            self.report(scan.path, Reason.EMPTY_EPISODE, detail=f"no step_<int>_<ACTION> frames; episode {ep} skipped")
            return None
        # Per step: the usable frame, or why that frame slot cannot be a window member.
        usable: dict[int, tuple[_FrameFile, ImageInfo]] = {}
        unusable: dict[int, tuple[str, Reason]] = {}
        labels: dict[int, _Descriptions] = {}
        reported: set[str] = set()
        present = sorted(scan.by_step)
        # Holes in the step numbers: one entry per run of missing steps (a mistyped step_99999
        # must not produce 99999 entries); each missing slot makes the windows over it unusable.
        for before, after in pairwise([-1, *present]):
            if after - before < 2:
                continue
            first, last = before + 1, after - 1
            where = scan.path / f"step_{first:04d}_*"
            if first == last:
                self.report(where, Reason.MISSING_STEP, f"{ep}/{first}", f"no frame file for step {first}")
                reported.add(f"{ep}/{first}")
            else:
                self.report(where, Reason.MISSING_STEP, None, f"no frame files for steps {first}..{last}")
            unusable.update({step: (str(where), Reason.MISSING_STEP) for step in range(first, last + 1)})
        for step in present:
            key = f"{ep}/{step}"
            files = scan.by_step[step]
            if len(files) > 1:
                names = ", ".join(f.path.name for f in files)
                for f in files:
                    self.report(f.path, Reason.DUPLICATE_STEP, key, f"step {step} appears {len(files)} times: {names}")
                unusable[step] = (str(files[0].path), Reason.DUPLICATE_STEP)
                reported.add(key)
                continue
            frame_file = files[0]
            image, text = per_file[frame_file.path]
            if isinstance(image, Problem):
                self.report(frame_file.path, image.reason, key, image.detail)
                unusable[step] = (str(frame_file.path), image.reason)
                reported.add(key)
            else:
                usable[step] = (frame_file, image)
            if frame_file.action is None:
                self.report(
                    frame_file.path,
                    Reason.UNKNOWN_ACTION,
                    key,
                    f"action {frame_file.action_text!r} is not one of {', '.join(ACTIONS)}",
                )
                reported.add(key)
            json_path = frame_file.path.with_suffix(".json")
            if isinstance(text, Problem):
                self.report(json_path, text.reason, key, text.detail + "; frame kept as history only")
                reported.add(key)
            else:
                labels[step] = text
        for orphan in scan.orphan_json:
            match = FRAME_STEM.match(orphan.name)
            key = f"{ep}/{int(match.group(1))}" if match else None
            self.report(orphan, Reason.MISSING_IMAGE, key, "frame description without an image file")

        if not usable:
            self.report(scan.path, Reason.EMPTY_EPISODE, detail=f"no usable frames; episode {ep} skipped")
            return None

        frame_rows: dict[int, int] = {}
        for step, (frame_file, image) in usable.items():
            row = frame_base + len(frames)
            frame_rows[step] = row
            frames.append(
                Frame(
                    row=row,
                    episode_id=ep,
                    index=step,
                    step=step,
                    action=frame_file.action,
                    path=frame_file.path,
                    relpath=f"{ep}/{frame_file.path.name}",
                    width=image.width,
                    height=image.height,
                    nbytes=image.nbytes,
                    sha256=image.sha256,
                )
            )

        sample_rows: list[int] = []
        for step, (frame_file, _image) in usable.items():
            key = f"{ep}/{step}"
            if step not in labels or frame_file.action is None:
                continue
            window = window_frames(step, self.history)
            bad = next((i for i in window if i in unusable), None)
            if bad is not None:
                if key not in reported:
                    file, reason = unusable[bad]
                    self.report(file, Reason.BAD_WINDOW_FRAME, key, f"window frame {bad} is unusable ({reason.value})")
                continue
            row = sample_base + len(samples)
            sample_rows.append(row)
            text = labels[step]
            samples.append(
                Sample(
                    row=row,
                    key=key,
                    episode_id=ep,
                    step=step,
                    window=window,
                    window_rows=tuple(frame_rows[i] for i in window),
                    instruction=scan.instruction,
                    subinstruction=subinstruction_for(
                        step, scan.subinstructions, scan.checkpoints, self.subinstruction_rule
                    ),
                    description_2d=text.landmark,
                    description_3d=text.spatial,
                    action=frame_file.action,
                    record=str(frame_file.path.with_suffix(".json")),
                )
            )
        return Episode(
            episode_id=ep,
            path=scan.path,
            instruction=scan.instruction,
            subinstructions=scan.subinstructions,
            checkpoints=scan.checkpoints,
            frame_rows=tuple(frame_rows.values()),
            sample_rows=tuple(sample_rows),
            texts_file=str(scan.path / MILESTONES_FILE),
        )


def _parse_milestones(data: object) -> tuple[str, tuple[str, ...], tuple[int, ...]] | str:
    """The episode texts, or a description of what is wrong with them."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    instruction = normalise_text(data.get("instruction_text"))
    if instruction is None:
        return "instruction_text is missing or empty"
    raw_subs = data.get("subinstructions")
    if not isinstance(raw_subs, list) or not raw_subs:
        return "subinstructions must be a non-empty list of strings"
    subs: list[str] = []
    for i, raw_sub in enumerate(raw_subs):
        sub = normalise_text(raw_sub)
        if sub is None:
            return f"subinstructions[{i}] is missing or empty"
        subs.append(sub)
    raw = data.get("completion_checkpoints", [])
    if not isinstance(raw, list):
        return "completion_checkpoints must be a list"
    checkpoints: list[int] = []
    for i, item in enumerate(raw):
        value = item.get("checkpoint_frame_index") if isinstance(item, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"completion_checkpoints[{i}] has no non-negative integer checkpoint_frame_index"
        checkpoints.append(value)
    # Sorted, as the reference does: the file's order of checkpoints carries no meaning.
    return instruction, tuple(subs), tuple(sorted(checkpoints))


@dataclass(frozen=True, slots=True)
class _Descriptions:
    landmark: str
    spatial: str


def _read_descriptions(path: Path) -> _Descriptions | Problem:
    data, problem = read_json(path)
    if problem is not None:
        return problem
    if not isinstance(data, dict):
        return Problem(Reason.EMPTY_DESCRIPTION, f"expected a JSON object, got {type(data).__name__}")
    landmark, spatial = normalise_text(data.get(LANDMARK_FIELD)), normalise_text(data.get(SPATIAL_FIELD))
    empty = [name for name, text in ((LANDMARK_FIELD, landmark), (SPATIAL_FIELD, spatial)) if text is None]
    if landmark is None or spatial is None:
        return Problem(Reason.EMPTY_DESCRIPTION, "missing or empty " + " and ".join(empty))
    return _Descriptions(landmark, spatial)
