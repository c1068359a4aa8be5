"""Several dataset sources: ``r2r=A rxr=B`` names each source, and the combined
index prefixes every key with its source and offsets the rows per source. (A cache of several
sources: tests/e2e/test_sources.py; a dataset that moves: tests/e2e/test_moved_dataset.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from janus_core.index import DatasetError, build_index, build_sources_index, parse_sources


def test_a_source_is_name_equals_path_or_a_bare_path_named_after_its_folder(tmp_path: Path) -> None:
    (tmp_path / "r2r").mkdir()
    (tmp_path / "ann.jsonl").write_text("")
    # One value may hold several sources separated by spaces (make's DATA="...").
    named, bare, annotation = parse_sources([f"rxr={tmp_path / 'r2r'}", f"{tmp_path / 'r2r'} {tmp_path / 'ann.jsonl'}"])
    assert (named.name, named.path, named.named) == ("rxr", tmp_path / "r2r", True)
    assert (bare.name, bare.path, bare.named) == ("r2r", tmp_path / "r2r", False)
    assert (annotation.name, annotation.named) == (tmp_path.name, False)  # the folder of its images
    with pytest.raises(DatasetError, match="have the same name 'r2r'"):
        parse_sources([str(tmp_path / "r2r"), f"r2r={tmp_path}"])
    with pytest.raises(DatasetError, match="the name before '=' must be a word"):
        parse_sources([f"bad/name={tmp_path}"])


def test_the_combined_index_prefixes_keys_and_offsets_rows_per_source(sources: tuple[Path, Path]) -> None:
    a, b = sources
    combined = build_sources_index([f"r2r={a}", f"rxr={b}"])
    alone_a, alone_b = build_index(a), build_index(b)
    assert [s.key for s in combined.samples] == (
        [f"r2r/{s.key}" for s in alone_a.samples] + [f"rxr/{s.key}" for s in alone_b.samples])
    assert [s.source for s in combined.samples] == ["r2r"] * len(alone_a.samples) + ["rxr"] * len(alone_b.samples)
    assert [e.episode_id for e in combined.episodes] == ["r2r/episode_0000", "r2r/episode_0001", "rxr/episode_0000"]
    for sample in combined.samples:  # every window points at frames of its own source and episode
        assert {f.episode_id for f in combined.window(sample)} == {sample.episode_id}
    first_b = combined.samples[len(alone_a.samples)]
    assert [f.path for f in combined.window(first_b)] == [f.path for f in alone_b.window(alone_b.samples[0])]
    # A single bare path keeps the dataset's own keys (and still records its source name).
    single = build_sources_index(a)
    assert [s.key for s in single.samples] == [s.key for s in alone_a.samples]
    assert {s.source for s in single.samples} == {"A"}


# A dataset that moves: DATA reaches the commands unsplit, whatever characters the path holds.


def test_one_value_naming_an_existing_path_is_one_source_whatever_its_characters(tmp_path: Path) -> None:
    spaced, accented, plain = (tmp_path / "my data", tmp_path / "données", tmp_path / "r2r")
    for folder in (spaced, accented, plain):
        folder.mkdir()
    (source,) = parse_sources([str(spaced)])
    assert (source.name, source.path) == ("my_data", spaced)  # a space cannot be in a key: '_'
    (source,) = parse_sources([str(accented)])
    assert (source.name, source.path) == ("données", accented)
    (source,) = parse_sources([f"r2r={spaced}"])
    assert (source.name, source.path, source.named) == ("r2r", spaced, True)
    # Several sources in one value: quote the path with a space.
    a, b = parse_sources([f'a="{spaced}" {plain}'])
    assert (a.name, a.path, b.name, b.path) == ("a", spaced, "r2r", plain)
