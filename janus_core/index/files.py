"""Per-file work shared by the input formats: image checks, JSON reads, content hashes, and the
base of the builders (a thread pool over files with a progress bar, and the problem list).

File reads, hashing and zlib release the GIL, so the checks run in threads.
"""

from __future__ import annotations

import abc
import errno
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from janus_core.index.model import DatasetIndex
from janus_core.index.problems import DatasetReport, Reason, ReportEntry

IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
# A file that starts like a frame and has an image suffix is a frame candidate; anything that does
# not then match the full pattern is reported, never ignored.
FRAME_NAME = re.compile(r"^step_(\d+)_([A-Za-z0-9_]+)\.(?i:png|jpe?g)$")
FRAME_STEM = re.compile(r"^step_(\d+)_")
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_T = TypeVar("_T")
_R = TypeVar("_R")


def content_hash(data: bytes) -> str:
    """Content hash of a frame file's bytes (sha256, hex): the one definition used everywhere."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class ImageInfo:
    width: int
    height: int
    nbytes: int
    sha256: str | None


@dataclass(frozen=True, slots=True)
class Problem:
    reason: Reason
    detail: str


def link_loop(path: Path | str) -> str | None:
    """Why ``path`` is a symbolic-link loop, or None: a link that never resolves (``x -> x``) or a
    link to a folder that holds it (``episode -> ..``), which a scan would walk into forever."""
    try:
        os.stat(path)
    except OSError as err:
        return "a symbolic link loop (it never resolves)" if err.errno == errno.ELOOP else None
    if not os.path.islink(path):
        return None
    target, parent = Path(path).resolve(), Path(path).parent.resolve()
    if parent.is_relative_to(target):
        return f"a symbolic link to {os.readlink(path)}, a folder that holds it (a loop)"
    return None


def inspect_image(path: Path, full: bool) -> ImageInfo | Problem:
    """Size, file size and (if ``full``) sha256 of an image, or why it is unusable."""
    try:
        if full:
            data = path.read_bytes()
            nbytes = len(data)
            opened = Image.open(io.BytesIO(data))
        else:
            nbytes = path.stat().st_size
            opened = Image.open(path)
    except FileNotFoundError:
        return Problem(Reason.MISSING_IMAGE, "file does not exist")
    except IsADirectoryError:
        return Problem(Reason.NOT_AN_IMAGE, "is a directory")
    except UnidentifiedImageError:
        return Problem(Reason.NOT_AN_IMAGE, "not a readable image format")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        # DecompressionBombError: more pixels than PIL's limit (Image.MAX_IMAGE_PIXELS) would decode.
        if isinstance(err, OSError) and err.errno == errno.ELOOP:
            return Problem(Reason.SYMLINK_LOOP, "a symbolic link loop (it never resolves)")
        return Problem(Reason.UNREADABLE_IMAGE, f"{type(err).__name__}: {err}")
    try:
        with opened as image:
            width, height = image.size
            if full:
                if image.format == "PNG":
                    # verify() checks every chunk's CRC (cheap, no decode) but accepts a file whose
                    # IEND chunk is cut short, so the exact IEND tail is checked as well.
                    image.verify()
                    if not data.endswith(_PNG_IEND):
                        return Problem(Reason.UNREADABLE_IMAGE, "truncated PNG (no complete IEND chunk)")
                else:
                    # JPEG's verify() is a no-op; only a decode notices a truncated file.
                    image.load()
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:
        return Problem(Reason.UNREADABLE_IMAGE, f"{type(err).__name__}: {err}")
    if width <= 0 or height <= 0:
        return Problem(Reason.UNREADABLE_IMAGE, f"empty image {width}x{height}")
    return ImageInfo(width, height, nbytes, content_hash(data) if full else None)


def read_json(path: Path) -> tuple[Any, Problem | None]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a byte-order mark
    except FileNotFoundError:
        return None, Problem(Reason.MISSING_FRAME_JSON, "file does not exist")
    except (OSError, UnicodeDecodeError) as err:
        return None, Problem(Reason.MALFORMED_JSON, f"cannot read: {type(err).__name__}: {err}")
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, Problem(Reason.MALFORMED_JSON, f"line {err.lineno} column {err.colno}: {err.msg}")


class Builder(abc.ABC):
    def __init__(self, history: int, check_images: bool, threads: int, subinstruction_rule: str) -> None:
        self.history = history
        self.subinstruction_rule = subinstruction_rule
        self.check_images = check_images
        self.threads = max(1, threads)
        self.entries: list[ReportEntry] = []
        self.progress = False
        self.known: MutableMapping[str, tuple[int, int, ImageInfo | Problem]] = {}
        """Image checks made earlier, by path, with the file's (size, mtime_ns) then (a stored
        index's, see ``janus_core.index.cached``); used while the file still has them."""
        self.inspected: list[str] = []
        """Images this builder read and checked (not known), as text (a ``Path`` is ~5x the bytes)."""

    def report(
        self, file: Path | str, reason: Reason, key: str | None = None, detail: str = "", line: int | None = None
    ) -> None:
        self.entries.append(ReportEntry(str(file), reason, key, detail, line))

    def inspect(self, path: Path) -> ImageInfo | Problem:
        """``inspect_image(path)``, or the known check of the file while its size and mtime are unchanged."""
        hit = self.known.get(str(path))
        if hit is not None:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if st is not None and (st.st_size, st.st_mtime_ns) == hit[:2]:
                return hit[2]
        self.inspected.append(str(path))
        return inspect_image(path, self.check_images)

    def inspect_images(self, paths: Sequence[Path]) -> list[ImageInfo | Problem]:
        return self.map(self.inspect, paths)

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        # Checking ~600k images takes minutes: show it (a bar on a terminal, sparse lines in logs).
        bar = tqdm(total=len(items), desc="indexing", unit=" files", disable=not self.progress,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0, file=sys.stderr)
        with bar:
            if self.threads == 1 or len(items) < 2:
                results = []
                for item in items:
                    results.append(fn(item))
                    bar.update()
                return results
            with ThreadPoolExecutor(max_workers=self.threads) as pool:
                results = []
                for result in pool.map(fn, items):
                    results.append(result)
                    bar.update()
                return results

    def collected(self) -> DatasetReport:
        return DatasetReport(tuple(self.entries))

    @abc.abstractmethod
    def build(self) -> DatasetIndex:
        """Scan the source, check every file and assemble the index (problems go to the report)."""
