"""Dependencies run one way: ``pipelines`` -> ``janus_train`` -> ``janus_cache``.

Every module of the three packages is parsed (not imported) and each import statement, at module
level or inside a function, is resolved to the package it names. The library packages must not
reach up: ``janus_cache`` imports nothing from ``janus_train`` or ``pipelines``, ``janus_train``
nothing from ``pipelines``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("janus_cache", "janus_train", "pipelines")
"""The package tree, lowest layer first."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "janus_cache": ("janus_train", "pipelines"),
    "janus_train": ("pipelines",),
    "pipelines": (),
}
"""For each package, the packages above it that it must not import."""


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, the source of module ``module``;
    relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # ``from pkg import mod`` may name a submodule: record both spellings.
            found.append((node.lineno, name))
            found.extend((node.lineno, f"{name}.{alias.name}") for alias in node.names)
    return found


def modules_of(package: str) -> list[Path]:
    return sorted((REPO_ROOT / package).rglob("*.py"))


def import_graph() -> dict[str, set[str]]:
    """Module -> the top-level packages of the tree that it imports, over every module."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in modules_of(package):
            targets = {name.split(".")[0] for _, name in imported_modules(path, module_name(path))}
            graph[module_name(path)] = targets & set(PACKAGES)
    return graph


def offenders() -> list[str]:
    """``file:line imports module`` for every import that goes against the layering."""
    found: dict[tuple[str, int], str] = {}
    for package in PACKAGES:
        for path in modules_of(package):
            for line, name in imported_modules(path, module_name(path)):
                where = (str(path.relative_to(REPO_ROOT)), line)
                if name.split(".")[0] in FORBIDDEN[package] and where not in found:
                    found[where] = name  # the module itself, not also each name taken from it
    return [f"{file}:{line} imports {name}" for (file, line), name in sorted(found.items())]


def test_the_scan_sees_every_package_and_its_imports() -> None:
    """The rule below is only as good as the scan: every package has modules, and the imports
    that must exist are found (the launch layer uses both libraries, training uses the cache)."""
    graph = import_graph()
    assert all(any(m.split(".")[0] == p for m in graph) for p in PACKAGES), sorted(graph)
    assert {"janus_cache", "janus_train"} <= graph["pipelines.train"]
    assert "janus_cache" in graph["pipelines.precompute"]
    assert "janus_cache" in graph["janus_train.trainer"]


def test_relative_and_nested_imports_are_resolved(tmp_path: Path) -> None:
    """``from ..x import y`` counts as an import of the package it climbs to, and an import inside
    a function counts like one at the top of the module."""
    source = tmp_path / "mod.py"
    source.write_text(
        "from ..cli import app\n"
        "from . import sibling\n"
        "def later():\n"
        "    import pipelines.train\n"
    )
    names = [name for _, name in imported_modules(source, "janus_cache.sub.mod")]
    assert "janus_cache.cli" in names and "janus_cache.cli.app" in names
    assert "janus_cache.sub.sibling" in names
    assert "pipelines.train" in names


def test_libraries_never_import_the_layers_above_them() -> None:
    """janus_cache imports nothing from janus_train or pipelines; janus_train nothing from pipelines."""
    found = offenders()
    assert found == [], "imports against the layering pipelines -> janus_train -> janus_cache:\n" + "\n".join(found)
