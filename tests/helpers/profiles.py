"""Profiles outside the repo and cache-tree digests for tests that run whole stages."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_PROFILE = REPO_ROOT / "configs" / "profiles" / "tiny.yaml"


VALIDATION_SETTINGS = ("val_cache", "val_episodes", "val_episodes_fraction", "val_max_samples", "eval_every",
                       "best_metric")


def write_test_profile(path: Path, cache: dict | None = None, vggt: dict | None = None,
                       keep_validation: bool = False) -> Path:
    """A copy of the tiny profile at ``path`` with absolute model paths and ``cache``/``vggt`` overrides.

    Model paths in a profile are relative to the YAML file, so a copy elsewhere needs them absolute.
    """
    import yaml

    data = yaml.safe_load(TINY_PROFILE.read_text())
    for section, key in (("vggt", "config"), ("vggt", "path"), ("qwen", "path")):
        if data[section].get(key) is not None:
            data[section][key] = str((TINY_PROFILE.parent / data[section][key]).resolve())
    # The stage tests count on training over every sample: the tiny profile's validation hold-out
    # is left out unless asked for (tests/test_validation.py).
    if not keep_validation:
        for name in VALIDATION_SETTINGS:
            data["train"].pop(name, None)
    data["cache"].update(cache or {})
    data["vggt"].update(vggt or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by its path relative to ``root``; a cache's stored
    dataset index (``index/``, a memo of the dataset's files, not cache content) is left out."""
    import hashlib

    from janus_cache.store.layout import INDEX_STORE_DIR

    return {
        rel: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not (rel := p.relative_to(root).as_posix()).startswith(INDEX_STORE_DIR + "/")
    }
