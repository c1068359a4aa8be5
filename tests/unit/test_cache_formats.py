"""The cache formats are declared once: a manifest, the writer and reader that
open_writer / open_cache pick, and precompute's ``--format`` choices all come from
:mod:`janus_cache.store.formats`."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from janus_cache.store import FORMATS, open_writer
from janus_cache.store.formats import CACHE_FORMATS, DEFAULT_FORMAT, cache_format
from pipelines import precompute


def test_each_format_names_its_own_writer_and_reader(tmp_path: Path) -> None:
    assert FORMATS == ("zarr", "wds") and DEFAULT_FORMAT == "zarr"
    for fmt in CACHE_FORMATS:
        writer = open_writer(fmt.name, tmp_path / fmt.name, "v")
        assert writer.format == fmt.name and isinstance(writer, fmt.writer_class())
        assert fmt.reader_class().format == fmt.name
    assert [f.name for f in CACHE_FORMATS if f.streaming] == ["wds"]


def test_an_unknown_format_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cache format must be one of zarr, wds, got 'hdf5'$"):
        cache_format("hdf5")
    with pytest.raises(ValueError, match=r"^cache format must be one of zarr, wds, got 'hdf5'$"):
        open_writer("hdf5", tmp_path, "v")


def test_precompute_offers_the_registered_formats(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(precompute.command)
    option = next(p for p in typer.main.get_command(app).params if "--format" in p.opts)
    assert (option.help, option.default) == ("zarr (random access) or wds (streaming).", "zarr")
    refused = CliRunner().invoke(app, [str(tmp_path), "--out", str(tmp_path / "c"), "--format", "hdf5"])
    assert refused.exit_code == 2 and "--format must be one of zarr, wds, got 'hdf5'" in refused.output
