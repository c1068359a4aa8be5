"""Input format 2, an annotation file: ``.json`` holding a list of records, or ``.jsonl`` with one
record a line. Each record is one sample with ``id``, instruction, subinstruction, the two
descriptions, an action (name or int code) and ``images`` (paths relative to the image root, the
current view last). Field aliases are listed in ``ANNOTATION_FIELDS``.

* Sample key: ``str(id)``, which must be unique (a repeated id is reported, the first one kept).
* Texts are normalised by :func:`janus_core.index.texts.normalise_text`.
* The window is the record's image list, in order: ``history + 1`` images (a record with another
  number is reported and skipped). A frame is one distinct image path; its
  episode is the folder of that path relative to the image root (``"."`` for the root itself),
  and its index is its position among that folder's referenced images, ordered by the step in
  a ``step_<n>_...`` file name, then by name. All images of a record must lie in one episode.
* When not one named image exists under the image root, the file is refused (``DatasetError``,
  naming the root and a path): its paths are relative to another folder.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from janus_core.index.files import FRAME_NAME, FRAME_STEM, Builder, Problem
from janus_core.index.model import ACTIONS, DatasetIndex, Episode, Frame, Sample, parse_action
from janus_core.index.problems import DatasetError, Reason
from janus_core.index.texts import normalise_text

ANNOTATION_FIELDS: dict[str, tuple[str, ...]] = {  # accepted names of each field, first match wins
    "instruction": ("instruction", "instruction_text", "full_instruction"),
    "subinstruction": ("subinstruction", "sub_instruction", "sub_instruction_text"),
    "description_2d": ("2D_description", "2d_description", "description_2d"),
    "description_3d": ("3D_description", "3d_description", "description_3d"),
    "action": ("action", "action_label"),
}


def _field(record: Mapping[str, Any], name: str) -> Any:
    for alias in ANNOTATION_FIELDS[name]:
        if alias in record and record[alias] is not None:
            return record[alias]
    return None


@dataclass
class _Record:
    key: str
    where: str
    line: int | None
    texts: dict[str, str]
    action: str
    images: tuple[str, ...]


class AnnotationBuilder(Builder):
    def __init__(
        self, file: Path, image_root: Path, history: int, check_images: bool, threads: int, subinstruction_rule: str
    ) -> None:
        super().__init__(history, check_images, threads, subinstruction_rule)
        self.file = file
        self.image_root = image_root
        self.seen_ids: dict[str, str] = {}
        self.referenced: list[str] = []

    def build(self) -> DatasetIndex:
        records = [r for r in (self._parse(raw, line, pos) for raw, line, pos in self._load()) if r is not None]

        # Frames: distinct image paths; index within an episode folder by step in the name, then name.
        relpaths = sorted({p for r in records for p in r.images})
        self.referenced = relpaths  # the images a stored index's fingerprint covers
        by_episode: dict[str, list[str]] = {}
        for rel in relpaths:
            by_episode.setdefault(posixpath.dirname(rel) or ".", []).append(rel)
        position: dict[str, tuple[str, int, int]] = {}
        for ep, members in by_episode.items():
            members.sort(key=_annotation_frame_order)
            for i, rel in enumerate(members):
                step = _name_step(posixpath.basename(rel))
                position[rel] = (ep, i, step if step is not None else i)
        checked = dict(zip(relpaths, self.inspect_images([self.image_root / rel for rel in relpaths]), strict=True))
        self._refuse_wrong_image_root(checked)

        frames: list[Frame] = []
        frame_rows: dict[str, int] = {}
        episode_frames: dict[str, list[int]] = {}
        for ep in sorted(by_episode):
            for rel in by_episode[ep]:
                info = checked[rel]
                if isinstance(info, Problem):
                    continue
                _ep, i, step = position[rel]
                row = len(frames)
                frame_rows[rel] = row
                episode_frames.setdefault(ep, []).append(row)
                name = posixpath.basename(rel)
                match = FRAME_NAME.match(name)
                frames.append(
                    Frame(
                        row=row,
                        episode_id=ep,
                        index=i,
                        step=step,
                        action=parse_action(match.group(2)) if match else None,
                        path=self.image_root / rel,
                        relpath=rel,
                        width=info.width,
                        height=info.height,
                        nbytes=info.nbytes,
                        sha256=info.sha256,
                    )
                )

        samples: list[Sample] = []
        episode_samples: dict[str, list[int]] = {}
        for record in records:
            problems = {rel: p for rel in record.images if isinstance(p := checked[rel], Problem)}
            if problems:
                for rel, problem in problems.items():
                    self.report(
                        self.image_root / rel,
                        problem.reason,
                        record.key,
                        f"{problem.detail}; image of the record at {record.where}",
                    )
                continue
            current = record.images[-1]
            ep, _i, step = position[current]
            if any(position[rel][0] != ep for rel in record.images):
                episodes = sorted({position[rel][0] for rel in record.images})
                self.report(
                    self.file,
                    Reason.MIXED_EPISODE_WINDOW,
                    record.key,
                    f"images come from several folders: {', '.join(episodes)}",
                    record.line,
                )
                continue
            row = len(samples)
            episode_samples.setdefault(ep, []).append(row)
            samples.append(
                Sample(
                    row=row,
                    key=record.key,
                    episode_id=ep,
                    step=step,
                    window=tuple(position[rel][1] for rel in record.images),
                    window_rows=tuple(frame_rows[rel] for rel in record.images),
                    instruction=record.texts["instruction"],
                    subinstruction=record.texts["subinstruction"],
                    description_2d=record.texts["description_2d"],
                    description_3d=record.texts["description_3d"],
                    action=record.action,
                    record=record.where,
                )
            )
        episodes = tuple(
            Episode(
                episode_id=ep,
                path=self.image_root / ep,
                instruction=None,
                subinstructions=(),
                checkpoints=(),
                frame_rows=tuple(episode_frames[ep]),
                sample_rows=tuple(episode_samples.get(ep, ())),
            )
            for ep in sorted(episode_frames)
        )
        return DatasetIndex(
            source=self.file,
            source_format="annotations",
            history=self.history,
            episodes=episodes,
            frames=tuple(frames),
            samples=tuple(samples),
            report=self.collected(),
            subinstruction_rule=self.subinstruction_rule,
        )

    def _refuse_wrong_image_root(self, checked: Mapping[str, Any]) -> None:
        """Not one image the records name exists: the paths are relative to another folder (an
        annotation file away from its images), which one line says, not a report of every image."""
        missing = [rel for rel, info in checked.items()
                   if isinstance(info, Problem) and info.reason is Reason.MISSING_IMAGE]
        if not missing or len(missing) < len(checked):
            return
        raise DatasetError(
            f"{self.file}: none of the {len(missing)} image paths its records name exists under the image root "
            f"{self.image_root} (e.g. {missing[0]}: no file {self.image_root / missing[0]}); pass the folder "
            "those paths are relative to as --image-root (default: the annotation file's folder)")

    def _load(self) -> Iterator[tuple[Any, int | None, int]]:
        """(raw record, JSONL line or None, position in the file) for every parseable record."""
        try:
            text = self.file.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetError(f"{self.file}: cannot read annotation file: {type(err).__name__}: {err}") from err
        if self.file.suffix.lower() == ".jsonl":
            position = 0
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as err:
                    self.report(self.file, Reason.MALFORMED_JSON, None, f"column {err.colno}: {err.msg}", number)
                    continue
                yield raw, number, position
                position += 1
            return
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            self.report(self.file, Reason.MALFORMED_JSON, None, f"{err.msg}; no records read", err.lineno)
            return
        if not isinstance(data, list):
            self.report(
                self.file, Reason.INVALID_RECORD, None, f"expected a JSON list of records, got {type(data).__name__}"
            )
            return
        for position, raw in enumerate(data):
            yield raw, None, position

    def _parse(self, raw: Any, line: int | None, position: int) -> _Record | None:
        where = f"{self.file}:{line}" if line is not None else f"{self.file} record {position}"
        detail_at = "" if line is not None else f" (record {position})"

        def bad(reason: Reason, key: str | None, detail: str) -> None:
            self.report(self.file, reason, key, detail + detail_at, line)

        if not isinstance(raw, dict):
            bad(Reason.INVALID_RECORD, None, f"expected a JSON object, got {type(raw).__name__}")
            return None
        rid = raw.get("id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or not str(rid).strip():
            bad(Reason.INVALID_RECORD, None, "missing or empty id")
            return None
        key = str(rid)
        if key in self.seen_ids:
            bad(Reason.DUPLICATE_ID, key, f"id {key!r} already used at {self.seen_ids[key]}; record skipped")
            return None
        self.seen_ids[key] = where
        texts: dict[str, str] = {}
        for name in ("instruction", "subinstruction"):
            value = normalise_text(_field(raw, name))
            if value is None:
                bad(Reason.INVALID_RECORD, key, f"{name} ({' / '.join(ANNOTATION_FIELDS[name])}) is missing or empty")
                return None
            texts[name] = value
        for name in ("description_2d", "description_3d"):
            value = normalise_text(_field(raw, name))
            if value is None:
                bad(
                    Reason.EMPTY_DESCRIPTION,
                    key,
                    f"{name} ({' / '.join(ANNOTATION_FIELDS[name])}) is missing or empty",
                )
                return None
            texts[name] = value
        raw_action = _field(raw, "action")
        action = parse_action(raw_action)
        if action is None:
            bad(
                Reason.UNKNOWN_ACTION,
                key,
                f"action {raw_action!r} is not one of {', '.join(ACTIONS)} or 0..{len(ACTIONS) - 1}",
            )
            return None
        images = raw.get("images")
        if not isinstance(images, list) or not images or not all(_is_path(p) for p in images):
            bad(Reason.NO_IMAGES, key, "images must be a non-empty list of paths")
            return None
        if len(images) != self.history + 1:
            # A cache stores windows of exactly this length: a shorter list would fail precompute.
            bad(Reason.WINDOW_LENGTH, key, f"{len(images)} images; a window is history + 1 = {self.history + 1} "
                                           "images (the current view last)")
            return None
        normalised = tuple(posixpath.normpath(p.replace(os.sep, "/")) for p in images)
        return _Record(key, where, line, texts, action, normalised)


def _name_step(name: str) -> int | None:
    match = FRAME_STEM.match(name)
    return int(match.group(1)) if match else None


def _annotation_frame_order(rel: str) -> tuple[bool, int, str]:
    step = _name_step(posixpath.basename(rel))
    return (step is None, step if step is not None else 0, rel)


def _is_path(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())
