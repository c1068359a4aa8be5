"""Dependencies run one way: ``benchmarks`` -> ``pipelines`` -> ``janus_train`` -> ``janus_cache`` ->
``janus_core``, the cache store builds on the core alone, and no module imports itself back through
others.

Every module of the four packages is parsed (not imported) and each import statement, at module
level, inside a function or under ``TYPE_CHECKING``, is resolved to the module it names. No package
reaches up: ``janus_core`` (the shared domain) imports none of the four above it, ``janus_cache``
nothing from the three above it, ``janus_train`` nothing from
``pipelines`` or ``benchmarks``, ``pipelines`` nothing from ``benchmarks``; and no package holds an
import loop (a fact that two modules both need lives in a third, below both). What a light command
imports at run time is checked by running it (``tests/e2e/test_imports.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.profiles import REPO_ROOT

PACKAGES = ("janus_core", "janus_cache", "janus_train", "pipelines", "benchmarks")
"""The package tree, lowest layer first."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "janus_core": ("janus_cache", "janus_train", "pipelines", "benchmarks"),
    "janus_cache": ("janus_train", "pipelines", "benchmarks"),
    "janus_train": ("pipelines", "benchmarks"),
    "pipelines": ("benchmarks",),
    "benchmarks": (),
}
"""For each package, the packages above it that it must not import."""


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module name, names taken from it) of every import in ``path``, the source of
    module ``module``; relative imports resolved; ``import a.b`` takes no names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name, tuple(alias.name for alias in node.names)))
    return found


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, name) of every import in ``path``; a ``from pkg import x`` gives both ``pkg`` and
    ``pkg.x`` (x may be a submodule), so a check of layers sees either spelling."""
    found = []
    for line, name, taken in imports_of(path, module):
        found.append((line, name))
        found.extend((line, f"{name}.{alias}") for alias in taken)
    return found


def modules_of(package: str, root: Path = REPO_ROOT) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def module_graph(root: Path = REPO_ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of the tree that it imports. ``from pkg import x`` counts for ``pkg.x``
    where that is a module (importing a submodule runs no more of ``pkg`` than any import from inside
    it does), else for ``pkg``; a name taken from a module counts for the module."""
    modules = {module_name(path, root): path for package in packages for path in modules_of(package, root)}

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for _, name, taken in imports_of(path, module):
            if not taken:
                targets.add(owner(name))
            for alias in taken:
                targets.add(f"{name}.{alias}" if f"{name}.{alias}" in modules else owner(name))
        graph[module] = targets - {"", module}
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import loop of ``graph``: the modules of each strongly connected component of more than
    one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
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


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_scan_sees_every_package_and_its_imports() -> None:
    """The rules below are only as good as the scan: every package has modules, and the imports
    that must exist are found (the launch layer uses both libraries, training uses the cache)."""
    graph = import_graph()
    assert all(any(m.split(".")[0] == p for m in graph) for p in PACKAGES), sorted(graph)
    assert {"janus_cache", "janus_train"} <= graph["pipelines.train_run"]
    assert "janus_cache" in graph["pipelines.precompute_run"]
    assert {"janus_core", "janus_cache"} <= graph["janus_train.data.from_profile"]
    assert "janus_core" in graph["janus_cache.store.manifest"]
    assert {"janus_cache", "pipelines", "benchmarks"} <= graph["benchmarks.bench_run"]
    assert "janus_train" in graph["benchmarks.flops"]
    modules = module_graph()
    assert "janus_train.config" in modules["janus_train.loop.validation"]
    assert "janus_core.index.model" in modules["janus_core.index.sources"]


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
    """janus_core imports no cache I/O, training or launch code; janus_cache nothing from janus_train
    or pipelines; janus_train nothing from pipelines."""
    found = offenders()
    assert found == [], ("imports against the layering pipelines -> janus_train -> janus_cache -> janus_core:\n"
                         + "\n".join(found))


TRAIN_ORDER = ("data", "model", "config", "run", "checkpoint", "evals", "loop", "build")
"""janus_train's folders and top-level modules, lowest first: each imports only those before it
(the reader's samples, prompts and M-RoPE ids; the model; the train settings, which take both's
facts; the run directory; checkpoints; the external evaluations of checkpoints; the loop; the run's
builder on top)."""


def train_order_offenders(graph: dict[str, set[str]]) -> list[str]:
    """``module imports module`` for every import of a janus_train module that reaches up
    :data:`TRAIN_ORDER`; a folder missing from the order is an offender too."""
    def place(module: str) -> int:
        part = module.split(".")[1]
        return TRAIN_ORDER.index(part) if part in TRAIN_ORDER else len(TRAIN_ORDER)

    found = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("janus_train."):
            continue
        if place(module) == len(TRAIN_ORDER):
            found.append(f"{module} is in no place of TRAIN_ORDER")
        found += [f"{module} imports {target}" for target in sorted(targets)
                  if target.startswith("janus_train.") and place(target) > place(module)]
    return found


def test_janus_trains_folders_import_one_way() -> None:
    """Inside janus_train, data/ imports no other folder, model/ only data/, config.py those two,
    run/ those three, and so on up to build.py, whatever the kind of import; the check finds an
    import that reaches up and a folder the order does not place."""
    assert train_order_offenders({"janus_train.data.x": {"janus_train.loop.y", "janus_core.z"},
                                  "janus_train.loop.y": {"janus_train.data.x"},
                                  "janus_train.extra.w": set()}) == [
        "janus_train.data.x imports janus_train.loop.y", "janus_train.extra.w is in no place of TRAIN_ORDER"]
    graph = module_graph()
    assert {module.split(".")[1] for module in graph if module.startswith("janus_train.")} == set(TRAIN_ORDER)
    found = train_order_offenders(graph)
    assert found == [], "imports against janus_train's folder order " + " -> ".join(TRAIN_ORDER) + ":\n" + \
        "\n".join(found)


STORE = "janus_cache.store"
"""The cache's storage formats: they read and write what the core defines, never stage 1's work
(planning, precomputing, verifying) that uses them."""


def test_the_store_builds_on_the_core_alone() -> None:
    """Every module of ``janus_cache.store`` imports only the core and the store itself: what a cache
    is keyed on lives in ``janus_cache.keys``, above the store, and no store module reaches it."""
    graph = module_graph()
    found = sorted(f"{module} imports {target}" for module, targets in graph.items() if module.startswith(STORE)
                   for target in targets
                   if target.startswith("janus_cache") and not (target == STORE or target.startswith(STORE + ".")))
    assert any(module.startswith(STORE + ".") for module in graph)
    assert found == [], "store modules importing stage 1:\n" + "\n".join(found)


def test_the_loop_finder_finds_a_loop_through_a_function_level_import() -> None:
    """Two modules importing each other, one of them only inside a function, are a loop; a chain is not."""
    assert import_loops({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def test_a_loop_through_a_type_checking_or_function_import_is_found_and_a_submodule_is_not_its_package(
        tmp_path: Path) -> None:
    """In a tree of files: a module that takes a type of another under ``TYPE_CHECKING`` while that
    one imports it is a loop; so is one through an import inside a function; but a submodule taken
    with ``from pkg import sub`` by a sibling is an import of ``pkg.sub``, not of ``pkg``'s
    ``__init__`` (which imports the sibling), so it is no loop."""
    write_tree(tmp_path, {
        "pkg/__init__.py": "from pkg.reader import Reader\n",
        "pkg/split.py": "def share(): ...\n",
        "pkg/reader.py": "from pkg import split\nclass Reader: ...\n",
        "pkg/model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sources import Source\n",
        "pkg/sources.py": "from pkg.model import Index\n",
        "pkg/config.py": "def later():\n    from pkg.validation import VAL\n",
        "pkg/validation.py": "from pkg.config import Settings\n",
    })
    graph = module_graph(tmp_path, ("pkg",))
    assert graph["pkg.reader"] == {"pkg.split"}
    assert import_loops(graph) == [["pkg.config", "pkg.validation"], ["pkg.model", "pkg.sources"]]


def test_no_package_holds_an_import_loop() -> None:
    """No module of janus_cache, janus_train, pipelines or benchmarks imports itself back through
    others, whether at module level, under TYPE_CHECKING or inside a function: the index model
    holds what a source is (its sources module builds on it), the train settings take the
    validation metrics' names from a module of their own (validation builds on the settings)."""
    loops = import_loops(module_graph())
    assert loops == [], "import loops (put what both modules need in a module below both):\n" + "\n".join(
        " <-> ".join(loop) for loop in loops)


RUN_BUILDING = ("torch.optim", "lr_scheduler", "AdamW", "LambdaLR", "deepspeed.initialize", "DeepSpeedEngine")
"""Names that make an optimizer, an LR schedule or a DeepSpeed engine: a training run's parts."""


def run_building(path: Path) -> list[str]:
    """``file:line name`` of every name, attribute or import in ``path`` that builds a run's parts."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.Name, ast.Attribute)):
            names = [ast.unparse(node)]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {name}" for name in names if any(part in name for part in RUN_BUILDING)]
    return sorted(set(found))


def test_the_launch_layer_builds_no_optimizer_scheduler_or_engine(tmp_path: Path) -> None:
    """Building a run has one home, ``janus_train.build``: no module of ``pipelines`` (ranks, locks,
    signals, exit codes) makes an optimizer, an LR schedule or a DeepSpeed engine; the check finds
    each of them where a module does."""
    builder = tmp_path / "builder.py"
    builder.write_text("import torch\nfrom deepspeed import initialize\n"
                       "opt = torch.optim.AdamW([])\nsched = torch.optim.lr_scheduler.LambdaLR(opt, len)\n")
    assert {line.split(" ", 1)[1] for line in run_building(builder)} == {
        "deepspeed.initialize", "torch.optim", "torch.optim.AdamW", "torch.optim.lr_scheduler",
        "torch.optim.lr_scheduler.LambdaLR"}
    found = [hit for path in modules_of("pipelines") for hit in run_building(path)]
    assert found == [], "pipelines/ building a run's parts (build them in janus_train.build):\n" + "\n".join(found)
    assert run_building(REPO_ROOT / "janus_train" / "build.py")  # where they are built
