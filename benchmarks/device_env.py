"""The Python environment of the prepared GPU run (``benchmarks/device_run.sh``): what the GPU
machine's image holds, what travels with the repository as wheels because it does not, and the
checks that the two together give janus every package it imports there.

The machine has no network. janus runs there from the source tree; every other package comes from
its image (Python 3.12) or from the wheels of ``device_wheels.txt`` in ``.whl/`` (``make
device-wheels`` downloads and checks them): transformers because the image's 5.17 is older than
pyproject.toml accepts, Liger for its rows, and zarr, numcodecs and webdataset (with their own
needs) because the run compares against verify's tolerances, whose package opens caches.

    python -m benchmarks.device_env .whl     # check downloaded wheels: one of each, tags, needs, install

prints one line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, cpython_tags, compatible_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
WHEELS_FILE = Path(__file__).with_name("device_wheels.txt")
PYPROJECT = REPO / "pyproject.toml"
WHEEL_DIR = ".whl"
"""Where ``make device-wheels`` puts the wheels (ignored by git; carried to the GPU machine)."""

PYTHON = (3, 12)
"""The GPU machine's python3 (3.12.3)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
"""Binary wheel platforms its x86-64 Linux takes (the ones `make device-wheels` asks pip for)."""

IMAGE_PACKAGES: frozenset[str] = frozenset(canonicalize_name(name) for name in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
"""The packages of the GPU machine's image (its package list as read there on 2026-11-17)."""
IMAGE_VERSIONS: dict[str, Version] = {canonicalize_name(name): Version(version) for name, version in {
    "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "tokenizers": "0.23.2", "huggingface-hub": "1.33.0", "accelerate": "1.15.0",
}.items()}
"""The image's versions that were read there (2026-11); the others' versions are not known here."""


def wheels(path: Path = WHEELS_FILE) -> dict[str, Version]:
    """The carried wheels, ``name==version`` per line of ``path`` (comments and blank lines skipped)."""
    out: dict[str, Version] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        pinned = [spec for spec in requirement.specifier if spec.operator == "=="]
        if len(pinned) != 1 or len(requirement.specifier) != 1:
            raise ValueError(f"{path.name}:{number}: expected NAME==VERSION, got {line!r}")
        name = canonicalize_name(requirement.name)
        if name in out:
            raise ValueError(f"{path.name}:{number}: {name} is listed twice (carry one version of each)")
        out[name] = Version(pinned[0].version)
    return out


def project_requirements(extras: Iterable[str] = ("kernels",)) -> dict[str, Requirement]:
    """pyproject.toml's dependencies and those of ``extras``, by canonical name."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = [*project["dependencies"], *(line for extra in extras for line in project["optional-dependencies"][extra])]
    return {canonicalize_name(r.name): r for r in map(Requirement, lines)}


def device_version(name: str, carried: dict[str, Version]) -> tuple[bool, Version | None]:
    """Whether the GPU machine has ``name`` (from a carried wheel or its image), and at which version
    where that is known."""
    name = canonicalize_name(name)
    if name in carried:
        return True, carried[name]
    return name in IMAGE_PACKAGES, IMAGE_VERSIONS.get(name)


def _needs(requires: Iterable[str]) -> list[Requirement]:
    """The unconditional requirements among ``requires`` (no extra, markers true on Linux CPython 3.12)."""
    environment = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                   "os_name": "posix", "extra": ""}
    return [r for r in map(Requirement, requires) if r.marker is None or r.marker.evaluate(environment)]


def installed_needs(name: str, version: Version) -> list[Requirement] | None:
    """The requirements of ``name`` as installed here, if it is installed here at ``version`` (else None)."""
    try:
        if Version(importlib.metadata.version(name)) != version:
            return None
        return _needs(importlib.metadata.requires(name) or [])
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_needs(wheel: Path) -> list[Requirement]:
    """The requirements in a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        message = Parser().parsestr(archive.read(metadata).decode())
    return _needs(message.get_all("Requires-Dist") or [])


def requirement_problems(owner: str, needs: Iterable[Requirement], carried: dict[str, Version]) -> list[str]:
    """Each requirement of ``owner`` the GPU machine would not meet (absent, or a known version outside it)."""
    problems = []
    for need in needs:
        present, version = device_version(need.name, carried)
        if not present:
            problems.append(f"{owner} needs {need}, which neither the GPU machine's image nor {WHEELS_FILE.name} has")
        elif version is not None and not need.specifier.contains(version, prereleases=True):
            problems.append(f"{owner} needs {need}; the GPU machine would have {version}")
    return problems


def device_problems(imported: Iterable[str], carried: dict[str, Version] | None = None) -> list[str]:
    """What the GPU machine would lack for a run that imported the distributions ``imported`` here:
    each must come from a carried wheel or the image, at a version pyproject.toml accepts where the
    version is known; a distribution that only an image package needs (as installed here) comes
    with the image. The carried wheels' own requirements (as installed here, where the suite runs
    the same versions) must be met too, and the suite must run the carried versions."""
    carried = wheels() if carried is None else carried
    requirements = project_requirements()
    names = {canonicalize_name(n) for n in imported} - {"janus"}
    # What the image's own packages need, as installed here (and what that needs in turn): on the
    # machine they come with the image, in its own versions.
    with_image: set[str] = set()
    todo = [name for name in names - set(carried) if name in IMAGE_PACKAGES]
    while todo:
        try:
            needs = {canonicalize_name(r.name) for r in _needs(importlib.metadata.requires(todo.pop()) or [])}
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += sorted(needs - with_image - set(carried))
        with_image |= needs
    problems = []
    for name in sorted(names):
        present, version = device_version(name, carried)
        if not present:
            if name not in with_image:
                problems.append(f"{name}: the device run imports it, but neither the GPU machine's image nor "
                                f"{WHEELS_FILE.name} has it")
            continue
        requirement = requirements.get(name)
        if requirement is not None and version is not None and not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{name} {version} on the GPU machine does not satisfy pyproject.toml's {requirement}; "
                            f"carry a wheel ({WHEELS_FILE.name})")
    for name, version in carried.items():
        try:
            here = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here (Liger needs Triton, CUDA only): make device-wheels checks its wheel
        if here != version:
            problems.append(f"{name}: the suite runs {here} here, {WHEELS_FILE.name} carries {version}; keep them equal")
        requirement = requirements.get(name)
        if requirement is not None and not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{WHEELS_FILE.name} carries {name} {version}, outside pyproject.toml's {requirement}")
        problems += requirement_problems(f"{name} {version}", installed_needs(name, version) or [], carried)
    return problems


def wheel_tags_ok(wheel: Path) -> bool:
    """Whether the GPU machine's pip takes ``wheel`` (CPython 3.12, manylinux x86_64, or pure)."""
    _, _, _, tags = parse_wheel_filename(wheel.name)
    accepted: set[Tag] = set(cpython_tags(PYTHON, platforms=PLATFORMS)) | set(compatible_tags(PYTHON, "cp312", PLATFORMS))
    return bool(tags & accepted)


def check_wheel_dir(folder: Path) -> list[str]:
    """Problems of downloaded wheels in ``folder``: each of the list exactly once at its version,
    nothing else, tags the GPU machine takes, requirements met there, and pip's own install of the
    set as the run installs it (``--no-index --no-deps --target``, for CPython 3.12 x86-64)."""
    carried = wheels()
    files = sorted(folder.glob("*.whl"))
    found: dict[str, list[Path]] = {}
    for wheel in files:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        found.setdefault(canonicalize_name(name), []).append(wheel)
    problems = [f"{name}=={version}: missing in {folder}" for name, version in carried.items() if name not in found]
    for name, paths in found.items():
        if name not in carried:
            problems.append(f"{paths[0].name}: not in {WHEELS_FILE.name} (remove it: two versions stop the install)")
        elif len(paths) > 1:
            problems.append(f"{name}: {len(paths)} wheels in {folder}; keep one version")
        elif parse_wheel_filename(paths[0].name)[1] != carried[name]:
            problems.append(f"{paths[0].name}: {WHEELS_FILE.name} asks for {name}=={carried[name]}")
        for wheel in paths:
            if not wheel_tags_ok(wheel):
                problems.append(f"{wheel.name}: not installable by the GPU machine's CPython 3.12 on x86-64 Linux")
            try:
                problems += requirement_problems(wheel.name, wheel_needs(wheel), carried)
            except (zipfile.BadZipFile, StopIteration):
                problems.append(f"{wheel.name}: not a readable wheel (download it again: make device-wheels)")
    if files and not problems:
        with tempfile.TemporaryDirectory() as target:
            platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
            install = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                 "--no-cache-dir", "--upgrade", "--target", target, "--python-version", "3.12", "--implementation",
                 "cp", "--only-binary=:all:", *platforms, *map(str, files)], capture_output=True, text=True)
            if install.returncode != 0:
                problems.append(f"pip could not install the wheels for CPython 3.12: {install.stderr.strip()[-500:]}")
    return problems


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else WHEEL_DIR)
    problems = check_wheel_dir(folder)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(1)
    total = sum(f.stat().st_size for f in folder.glob("*.whl"))
    print(f"{folder}: {len(wheels())} wheels, {total / 2**20:.1f} MiB, installable on the GPU machine")


if __name__ == "__main__":
    main()
