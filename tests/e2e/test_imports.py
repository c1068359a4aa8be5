"""Dependencies run one way: ``benchmarks`` -> ``pipelines`` -> ``janus_train`` -> ``janus_cache``.

Every module of the four packages is parsed (not imported) and each import statement, at module
level or inside a function, is resolved to the package it names. No package reaches up:
``janus_cache`` imports nothing from the three above it, ``janus_train`` nothing from ``pipelines``
or ``benchmarks``, ``pipelines`` nothing from ``benchmarks``; and no module imports itself back
through others (no import loop). What a light command imports is checked by running it: the
command line's help and reading a profile import neither torch nor transformers.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from helpers.profiles import REPO_ROOT

PACKAGES = ("janus_cache", "janus_train", "pipelines", "benchmarks")
"""The package tree, lowest layer first."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "janus_cache": ("janus_train", "pipelines", "benchmarks"),
    "janus_train": ("pipelines", "benchmarks"),
    "pipelines": ("benchmarks",),
    "benchmarks": (),
}
"""For each package, the packages above it that it must not import."""

HEAVY = ("torch", "transformers", "deepspeed")
"""Packages that cost seconds to import: a light command must not need them."""

HELP_CPU_SECONDS = 1.0
"""The most CPU time (user + system) ``janus-cache --help`` may take."""


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


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of the tree that it imports (a ``from pkg import name`` counts for
    ``pkg.name`` where that is a module, else for ``pkg``)."""
    modules = {module_name(path): path for package in PACKAGES for path in modules_of(package)}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for _, name in imported_modules(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]  # a name taken from a module: the module itself
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import loop of ``graph``: the modules of each strongly connected component of more than
    one module (Tarjan's algorithm), sorted. A package's ``__init__`` importing its own modules is
    not a loop unless one of them imports the package back."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(loops)


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
    assert {"janus_cache", "janus_train", "pipelines"} <= graph["benchmarks.bench"]


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


def test_the_loop_finder_finds_a_loop_through_a_function_level_import() -> None:
    """Two modules importing each other, one of them only inside a function, are a loop; a chain is not."""
    assert import_loops({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def test_the_benchmarks_import_no_loop() -> None:
    """The benchmarks' modules import one another one way (the CPU bench uses the GPU bench's
    shapes, both use the data-path section and the measurement helpers), never back."""
    graph = module_graph()
    assert "benchmarks.bench_gpu" in graph["benchmarks.bench"]
    loops = [loop for loop in import_loops(graph) if any(m.startswith("benchmarks") for m in loop)]
    assert loops == [], f"import loops: {loops}"


def fresh_interpreter(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python process on this tree's packages (not an installed copy)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


LOADED_HEAVY = f"""
import json, sys
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(json.dumps(heavy[:5]))
"""
"""Appended to a snippet: prints the heavy modules the snippet imported (the first few)."""


def test_janus_cache_help_imports_no_torch_nor_transformers() -> None:
    """``janus-cache --help`` lists every command (the stage commands too, by their docstrings)
    without importing a stage module, torch or transformers."""
    done = fresh_interpreter(
        "import sys\n"
        "from pipelines.cache_cli import app\n"
        "sys.argv = ['janus-cache', '--help']\n"
        "try:\n    app()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "assert 'pipelines.precompute' not in sys.modules and 'pipelines.verify' not in sys.modules\n"
        + LOADED_HEAVY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Precompute a cache of frozen-VGGT features" in done.stdout
    assert "Check that a cache is complete" in done.stdout
    assert " bench " in done.stdout and " info " in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_loading_a_profile_imports_no_torch_nor_transformers() -> None:
    """Reading a profile (what the Makefile does for nproc_per_node) needs no deep-learning package."""
    done = fresh_interpreter(
        "import sys\n"
        "from janus_cache.profile import load_profile\n"
        "profile = load_profile(sys.argv[1])\n"
        "assert profile.nproc_per_node == 2 and profile.cache.reference_frame == 'last', profile\n"
        + LOADED_HEAVY, "tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_janus_cache_help_costs_at_most_one_cpu_second() -> None:
    """The console script itself, in a new process: user + system CPU time (not wall time, which
    a loaded machine stretches) of ``janus-cache --help`` stays within a second."""
    script = Path(sys.executable).parent / "janus-cache"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([str(script), "--help"], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "precompute" in done.stdout
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu <= HELP_CPU_SECONDS, f"janus-cache --help took {cpu:.2f} CPU-s (at most {HELP_CPU_SECONDS})"
