"""The cache manifest: what a cache holds and the settings it was made with.

A manifest is ``<cache>/manifest.json`` (:mod:`janus_cache.store.layout`): stable JSON (sorted keys) of a :class:`Manifest`. Its
fields are of two kinds:

* **keyed** (:data:`KEYED_FIELDS`): the schema version, format, the base model whose frames the
  cache stores (``base``, a ``model_type`` of :mod:`janus_core.bases`; a manifest without it was
  made before there was a second base and is Qwen2.5-VL's), window variant, encoder
  fingerprint, feature dtypes, dataset identity, shard layout, the definition of every
  resolution and, per resolution, the cached frozen-ViT output (``vit_features``: the ViT weights'
  fingerprint, the base model, dtype and shape; optional, compared like resolutions). A cache is only reused (resumed, extended, trained from) when these equal the
  caller's; :func:`keyed_differences` names each one that differs. Resolutions are compared by
  name: a resolution the cache lacks is an *addition* (the cache can hold several), not a
  difference, and resolutions the caller does not ask for are left alone.
* **recorded**: counts, the shard table, compression settings and tool/library versions. They
  describe the cache but never make it incompatible (versions are worth a warning:
  :func:`version_differences`).

Exactly one process may write the manifest (rank 0 of a precompute); the caller must ensure it.
The write itself is atomic (temporary file, fsync, rename), so readers see the old or the new
manifest, never a torn one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from janus_cache.store.checksums import record_metadata
from janus_cache.store.features import STORED_DTYPES
from janus_cache.store.formats import cache_format
from janus_cache.store.layout import CacheLayout
from janus_core.bases import BASES, DEFAULT_BASE
from janus_core.index.identity import EpisodeIdentity
from janus_core.index.subinstructions import DEFAULT_SUBINSTRUCTION_RULE
from janus_core.system.files import atomic_write_bytes
from janus_core.windows import ATTENTION_MODES, REFERENCE_FRAMES

SCHEMA_VERSION = 3
"""Version of the cache layout and manifest schema; bumped on any incompatible change.
2: sample texts follow the reference's normalisation and the keyed ``dataset.subinstruction_rule``.
3: every zarr chunk ends in a crc32c, every tar sample carries crc32c of its members, and
``checksums.json`` records the sha256 of every metadata file; the dataset identity is per episode
(``episodes.json``, texts and actions included), with the source names; samples record their
``source``. Older caches are refused (they cannot be checked on read): rebuild them with
``precompute --overwrite``."""


KEYED_FIELDS: tuple[str, ...] = (
    "schema_version",
    "format",
    "base",
    "window",
    "encoder_fingerprint",
    "feature_dtype",
    "stored_dtype",
    "dataset",
    "layout",
    "resolutions",
    "vit_features",
)
"""Fields that must be equal for a cache to be reused; every other field is only recorded."""

_BY_RESOLUTION = ("resolutions", "vit_features")
"""Keyed fields holding one entry per resolution: only resolutions both manifests hold are compared."""

_SAMPLING_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_RESOLUTION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class ManifestError(ValueError):
    """A manifest file is unreadable or not a valid manifest; the message names the file."""


class SchemaVersionError(ManifestError):
    """The manifest is of another schema version: the cache must be rebuilt, not repaired."""


@dataclass(frozen=True)
class FieldDiff:
    """One keyed field, by dotted name (e.g. ``window.history``), with both values."""

    name: str
    existing: Any
    wanted: Any

    def __str__(self) -> str:
        return f"{self.name}: cache has {self.existing!r}, wanted {self.wanted!r}"


class ManifestMismatch(ManifestError):
    """An existing cache was made with different keyed settings; names every differing field."""

    def __init__(self, differences: list[FieldDiff], source: str = "the cache") -> None:
        self.differences = list(differences)
        self.source = source
        listed = "; ".join(str(d) for d in self.differences)
        super().__init__(f"{source} was made with different settings ({listed})")


@dataclass(frozen=True)
class WindowVariant:
    """Which frames a sample sees and which encoder output is kept for it.

    ``history`` earlier frames plus the current one (``history + 1`` frames) chosen by the
    sampling rule named ``sampling``; the feature is layer ``layer``'s patch tokens of the
    ``reference_frame`` of the window under ``attention`` ("causal" or "full") global attention.
    """

    history: int
    sampling: str
    reference_frame: str
    layer: int
    attention: str

    def __post_init__(self) -> None:
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 0:
            raise ValueError(f"window history must be a non-negative int, got {self.history!r}")
        if not isinstance(self.sampling, str) or not _SAMPLING_RE.match(self.sampling):
            raise ValueError(
                f"window sampling rule name must be lower-case letters, digits and '-', got {self.sampling!r}"
            )
        if self.reference_frame not in REFERENCE_FRAMES:
            raise ValueError(f"reference_frame must be one of {REFERENCE_FRAMES}, got {self.reference_frame!r}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int):
            raise TypeError(f"window layer must be an int, got {self.layer!r}")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {self.attention!r}")

    @property
    def frames(self) -> int:
        """Frames per window."""
        return self.history + 1

    @property
    def name(self) -> str:
        """Path-safe name used in array paths, e.g. ``h8_linspace_ref-first_layer-2_causal``."""
        return f"h{self.history}_{self.sampling}_ref-{self.reference_frame}_layer{self.layer}_{self.attention}"


@dataclass(frozen=True)
class DatasetIdentity:
    """A digest over every episode's identity (``janus_core.index.identity``: source, frames,
    texts, actions; in order), the counts, the source names in order, and the rule that gave each
    sample its subinstruction (it changes the stored texts). The per-episode identities are stored
    next to the manifest (:func:`write_episodes`), so a change can be traced to its episode."""

    digest: str
    n_episodes: int
    n_frames: int
    n_samples: int
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))

    @classmethod
    def compute(
        cls,
        episodes: Iterable[EpisodeIdentity],
        subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE,
        sources: Iterable[str] = (),
    ) -> DatasetIdentity:
        """Identity of a dataset whose episodes, in index order, are ``episodes``.

        Each episode contributes one JSON line, so no id can be confused with another field.
        """
        digest = hashlib.sha256()
        n_episodes = n_frames = n_samples = 0
        for episode in episodes:
            digest.update(json.dumps([episode.source, episode.episode_id, episode.digest]).encode() + b"\n")
            n_episodes, n_frames, n_samples = n_episodes + 1, n_frames + episode.frames, n_samples + episode.samples
        digest.update(json.dumps({"episodes": n_episodes, "frames": n_frames, "samples": n_samples}).encode())
        return cls(digest=digest.hexdigest(), n_episodes=n_episodes, n_frames=n_frames, n_samples=n_samples,
                   subinstruction_rule=subinstruction_rule, sources=tuple(sources))


@dataclass(frozen=True)
class ResolutionEntry:
    """One resolution held by the cache: how frames were made, and the stored shapes."""

    name: str
    preprocessing: Mapping[str, Any]
    frame_shape: tuple[int, int, int]
    feature_shape: tuple[int, int]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _RESOLUTION_RE.match(self.name):
            raise ValueError(f"resolution name must be a path-safe word like 'pad644', got {self.name!r}")
        object.__setattr__(self, "frame_shape", tuple(int(x) for x in self.frame_shape))
        object.__setattr__(self, "feature_shape", tuple(int(x) for x in self.feature_shape))
        object.__setattr__(self, "preprocessing", dict(self.preprocessing))
        if len(self.frame_shape) != 3 or self.frame_shape[2] != 3:
            raise ValueError(f"frame_shape of {self.name} must be (H, W, 3), got {self.frame_shape}")
        if len(self.feature_shape) != 2:
            raise ValueError(f"feature_shape of {self.name} must be (N, 2C), got {self.feature_shape}")


@dataclass(frozen=True)
class ViTFeaturesEntry:
    """The cached output of Qwen's frozen ViT blocks for the frames of one resolution (``vit/<name>``):
    which tower made it (the weights' fingerprint, the base model's directory name) and the stored
    per-frame shape ``(grid tokens, D)`` (a DeepStack base, Qwen3-VL: ``(levels, grid tokens, D)``,
    :mod:`janus_core.qwen_vit`) and logical dtype (bf16 is stored as its uint16 bits)."""

    name: str
    fingerprint: str
    base_model: str
    dtype: str
    feature_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _RESOLUTION_RE.match(self.name):
            raise ValueError(f"resolution name must be a path-safe word like 'pad644', got {self.name!r}")
        object.__setattr__(self, "feature_shape", tuple(int(x) for x in self.feature_shape))
        if self.dtype not in STORED_DTYPES:
            raise ValueError(f"ViT feature dtype must be one of {sorted(STORED_DTYPES)}, got {self.dtype!r}")
        if len(self.feature_shape) not in (2, 3):
            raise ValueError(f"ViT feature_shape of {self.name} must be (tokens, D) or (levels, tokens, D), "
                             f"got {self.feature_shape}")

    @property
    def stored_dtype(self) -> str:
        return STORED_DTYPES[self.dtype]


@dataclass(frozen=True)
class ShardSizes:
    """Rows per shard of the frame arrays and of the per-sample arrays."""

    frames_per_shard: int
    samples_per_shard: int

    def __post_init__(self) -> None:
        for name in ("frames_per_shard", "samples_per_shard"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class ShardEntry:
    """A row of the shard table: one shard of one array and its commit state."""

    shard: int
    start: int
    stop: int
    committed: bool
    nbytes: int = 0
    sha256: str = ""


@dataclass(frozen=True)
class Manifest:
    """Everything a cache records about itself. See the module docstring for keyed fields."""

    format: str
    window: WindowVariant
    encoder_fingerprint: str
    feature_dtype: str
    dataset: DatasetIdentity
    layout: ShardSizes
    resolutions: Mapping[str, ResolutionEntry]
    counts: Mapping[str, int] = field(default_factory=dict)
    shards: Mapping[str, tuple[ShardEntry, ...]] = field(default_factory=dict)
    compression: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    vit_features: Mapping[str, ViTFeaturesEntry] = field(default_factory=dict)
    """Resolution -> its cached ViT features (``cache.vit_features``); none for most caches."""
    base: str = DEFAULT_BASE.model_type
    """``model_type`` of the base whose frames the cache stores (docs/bases.md): its frame size and
    the VGGT frame the features come from follow from it and the resolution."""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        cache_format(self.format)  # a ValueError naming the known formats
        if self.feature_dtype not in STORED_DTYPES:
            raise ValueError(f"feature_dtype must be one of {sorted(STORED_DTYPES)}, got {self.feature_dtype!r}")
        if self.base not in BASES:
            raise ValueError(f"base must be one of {sorted(BASES)}, got {self.base!r}")
        for key, entry in self.resolutions.items():
            if key != entry.name:
                raise ValueError(f"resolution entry {entry.name!r} is filed under {key!r}")
        # Normalised containers: sorted by name, so equal manifests compare (and serialise) equal.
        object.__setattr__(self, "resolutions", dict(sorted(self.resolutions.items())))
        for key, vit in self.vit_features.items():
            if key != vit.name:
                raise ValueError(f"ViT features entry {vit.name!r} is filed under {key!r}")
        object.__setattr__(self, "vit_features", dict(sorted(self.vit_features.items())))
        object.__setattr__(
            self, "shards", {k: tuple(sorted(v, key=lambda e: e.shard)) for k, v in sorted(self.shards.items())}
        )
        object.__setattr__(self, "counts", dict(sorted(self.counts.items())))
        object.__setattr__(self, "compression", dict(self.compression))
        object.__setattr__(self, "versions", dict(sorted(self.versions.items())))

    @property
    def stored_dtype(self) -> str:
        """dtype of the stored feature arrays (bf16 is stored as its uint16 bits)."""
        return STORED_DTYPES[self.feature_dtype]

    # -- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stored_dtype"] = self.stored_dtype
        data["shards"] = {name: [asdict(e) for e in entries] for name, entries in self.shards.items()}
        if self.base == DEFAULT_BASE.model_type:  # written as before a second base existed
            del data["base"]
        return data

    def to_json(self) -> str:
        """Stable JSON: sorted keys, fixed indentation, trailing newline."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<manifest>") -> Manifest:
        if not isinstance(data, Mapping):
            raise ManifestError(f"{source} is not a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{source} has schema_version {version!r}; this janus reads schema_version {SCHEMA_VERSION} "
                "(rebuild the cache: precompute --overwrite)"
            )
        try:
            manifest = cls(
                schema_version=int(data["schema_version"]),
                format=data["format"],
                window=WindowVariant(**data["window"]),
                encoder_fingerprint=data["encoder_fingerprint"],
                feature_dtype=data["feature_dtype"],
                dataset=DatasetIdentity(**data["dataset"]),
                layout=ShardSizes(**data["layout"]),
                resolutions={name: ResolutionEntry(**entry) for name, entry in data["resolutions"].items()},
                counts=dict(data["counts"]),
                shards={
                    name: tuple(ShardEntry(**entry) for entry in entries) for name, entries in data["shards"].items()
                },
                compression=dict(data["compression"]),
                versions=dict(data["versions"]),
                vit_features={name: ViTFeaturesEntry(**entry)
                              for name, entry in data.get("vit_features", {}).items()},
                base=data.get("base", DEFAULT_BASE.model_type),
            )
            stored = data["stored_dtype"]
        except KeyError as exc:
            raise ManifestError(f"{source} lacks the field {exc.args[0]!r}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"{source} is not a valid manifest: {exc}") from exc
        if stored != manifest.stored_dtype:
            raise ManifestError(
                f"{source} says {manifest.feature_dtype} features are stored as {stored!r}; "
                f"they are stored as {manifest.stored_dtype!r}"
            )
        return manifest

    @classmethod
    def from_json(cls, text: str, source: str = "<manifest>") -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{source} is not valid JSON: {exc}") from exc
        return cls.from_dict(data, source)


# ----------------------------------------------------------------------------------------------
# comparing manifests


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    """Dotted-name leaves of a dataclass / mapping tree, e.g. ``{"window.history": 8}``."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: v for f in fields(value) for k, v in _flatten(getattr(value, f.name), f"{prefix}.{f.name}").items()}
    if isinstance(value, Mapping):
        if not value:
            return {prefix: {}}
        return {k: v for key in sorted(value) for k, v in _flatten(value[key], f"{prefix}.{key}").items()}
    if isinstance(value, list):
        return {prefix: tuple(value)}
    return {prefix: value}


def keyed_differences(existing: Manifest, wanted: Manifest) -> list[FieldDiff]:
    """Every keyed field whose value differs between ``existing`` and ``wanted``, by dotted name.

    Only resolutions present in both are compared (see the module docstring).
    """
    diffs: list[FieldDiff] = []
    for name in KEYED_FIELDS:
        old, new = getattr(existing, name), getattr(wanted, name)
        if name in _BY_RESOLUTION:
            shared = sorted(set(old) & set(new))
            old, new = {k: old[k] for k in shared}, {k: new[k] for k in shared}
        flat_old, flat_new = _flatten(old, name), _flatten(new, name)
        for key in sorted(set(flat_old) | set(flat_new)):
            if flat_old.get(key) != flat_new.get(key):
                diffs.append(FieldDiff(key, flat_old.get(key), flat_new.get(key)))
    return diffs


def keyed_digest(manifest: Manifest) -> str:
    """sha256 of the manifest's keyed fields (recorded in ``checksums.json``): equal digests, equal
    keyed settings, so a damaged manifest can be rebuilt from settings that have its digest."""
    # A cache without ViT features, or of the first base, digests as it did before the field existed.
    flat = {k: v for name in KEYED_FIELDS if _digested(manifest, name)
            for k, v in _flatten(getattr(manifest, name), name).items()}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()


def _digested(manifest: Manifest, name: str) -> bool:
    if name == "vit_features":
        return bool(manifest.vit_features)
    if name == "base":
        return manifest.base != DEFAULT_BASE.model_type
    return True


def check_compatible(existing: Manifest, wanted: Manifest, source: str = "the cache") -> None:
    """Raise :class:`ManifestMismatch` naming every keyed field that differs."""
    diffs = keyed_differences(existing, wanted)
    if diffs:
        raise ManifestMismatch(diffs, source)


def version_differences(existing: Manifest, wanted: Manifest) -> list[FieldDiff]:
    """Tool and library versions that differ (worth a warning, never a refusal)."""
    names = sorted(set(existing.versions) | set(wanted.versions))
    return [
        FieldDiff(f"versions.{n}", existing.versions.get(n), wanted.versions.get(n))
        for n in names
        if existing.versions.get(n) != wanted.versions.get(n)
    ]


def merge_manifests(existing: Manifest, wanted: Manifest, source: str = "the cache") -> Manifest:
    """The manifest of a cache after ``wanted`` was (re)written into the compatible ``existing`` one.

    Keyed fields must be equal (else :class:`ManifestMismatch`); resolutions and shard tables are
    the union, ``wanted`` winning where both have an entry; counts, compression and versions are
    ``wanted``'s.
    """
    check_compatible(existing, wanted, source)
    return replace(
        wanted,
        resolutions={**existing.resolutions, **wanted.resolutions},
        vit_features={**existing.vit_features, **wanted.vit_features},
        shards={**existing.shards, **wanted.shards},
    )


# ----------------------------------------------------------------------------------------------
# files


def read_manifest(root: Path) -> Manifest | None:
    """The manifest of the cache at ``root``, or None when it has none yet."""
    path = CacheLayout(root).manifest
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return Manifest.from_json(text, source=str(path))


def write_manifest(root: Path, manifest: Manifest) -> Path:
    """Atomically (re)write the manifest of the cache at ``root``, then record the checksums of every
    metadata file (:mod:`janus_cache.store.checksums`). Single writer: see module doc."""
    path = CacheLayout(root).manifest
    atomic_write_bytes(path, manifest.to_json().encode())
    record_metadata(root, keyed_digest(manifest))
    return path


def write_episodes(root: Path, episodes: Iterable[EpisodeIdentity]) -> Path:
    """Atomically (re)write the per-episode identities of the cache at ``root`` (single writer)."""
    path = CacheLayout(root).episodes
    data = {"episodes": [e.to_dict() for e in episodes]}
    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode())
    return path


def read_episodes(root: Path) -> tuple[EpisodeIdentity, ...] | None:
    """The per-episode identities of the cache at ``root`` (None when it has none); a damaged
    file is a :class:`ManifestError` naming it."""
    path = CacheLayout(root).episodes
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        items = data["episodes"]
        if not isinstance(items, list):
            raise TypeError("'episodes' is not a list")
        return tuple(EpisodeIdentity.from_dict(item, f"{path} entry {i}") for i, item in enumerate(items))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise ManifestError(f"{path} is not a valid episode table: {err}") from None


def library_versions() -> dict[str, str]:
    """Versions of Python and the libraries that shape the stored bytes (recorded, not keyed)."""
    versions = {"python": platform.python_version()}
    for dist in ("janus", "numpy", "torch", "zarr", "numcodecs", "webdataset"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return versions
