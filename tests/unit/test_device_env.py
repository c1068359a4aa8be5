"""What the prepared GPU run carries to a machine without network (benchmarks/device_env.py): the
wheel list, and the checks that the machine's image and the wheels together give janus what it
imports, at versions pyproject.toml accepts. (The import set of a real smoke run is checked in
tests/e2e/test_device_run.py; `make device-wheels` checks the downloaded wheels themselves.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from benchmarks.device_env import (
    IMAGE_PACKAGES,
    IMAGE_VERSIONS,
    check_wheel_dir,
    device_problems,
    project_requirements,
    wheel_tags_ok,
    wheels,
)


def test_every_carried_wheel_is_pinned_once_and_within_pyproject() -> None:
    carried = wheels()
    requirements = project_requirements()
    assert {"transformers", "liger-kernel", "zarr", "numcodecs", "webdataset"} <= set(carried)
    for name, version in carried.items():
        if name in requirements:
            assert requirements[name].specifier.contains(version), (name, version)


def test_transformers_travels_because_the_images_is_older_than_janus_accepts() -> None:
    assert "transformers" in IMAGE_PACKAGES
    assert not project_requirements()["transformers"].specifier.contains(IMAGE_VERSIONS["transformers"])
    carried = wheels()
    assert device_problems(["transformers"], carried) == []
    without = {name: version for name, version in carried.items() if name != "transformers"}
    (problem,) = device_problems(["transformers"], without)
    assert problem.startswith("transformers 5.17.0 on the GPU machine does not satisfy pyproject.toml's transformers")


def test_a_package_neither_in_the_image_nor_carried_is_named() -> None:
    problems = device_problems(["torch", "numpy", "deepspeed"])
    assert problems == ["deepspeed: the device run imports it, but neither the GPU machine's image nor "
                        "device_wheels.txt has it"]


def test_a_carried_version_the_suite_does_not_run_is_refused(tmp_path: Path) -> None:
    listed = tmp_path / "wheels.txt"
    listed.write_text("# comment\nzarr==3.0.0\n")
    problems = device_problems(["zarr"], wheels(listed))
    assert any(p.startswith("zarr: the suite runs ") and "carries 3.0.0; keep them equal" in p for p in problems)
    listed.write_text("zarr==3.0.0\nzarr==3.1.0\n")
    with pytest.raises(ValueError, match=r"wheels.txt:2: zarr is listed twice"):
        wheels(listed)
    listed.write_text("zarr>=3\n")
    with pytest.raises(ValueError, match=r"wheels.txt:1: expected NAME==VERSION"):
        wheels(listed)


@pytest.mark.parametrize(("name", "ok"), [
    ("numcodecs-0.16.6-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl", True),
    ("google_crc32c-1.9.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
    ("transformers-5.24.0-py3-none-any.whl", True),
    ("braceexpand-0.1.7-py2.py3-none-any.whl", True),
    ("numcodecs-0.16.6-cp311-cp311-manylinux_2_28_x86_64.whl", False),
    ("numcodecs-0.16.6-cp312-cp312-macosx_11_0_arm64.whl", False),
    ("numcodecs-0.16.6-cp312-cp312-manylinux_2_28_aarch64.whl", False),
])
def test_wheel_tags_the_gpu_machines_python_takes(name: str, ok: bool) -> None:
    assert wheel_tags_ok(Path(name)) is ok


def test_a_wheel_folder_missing_wheels_or_holding_two_versions_is_refused(tmp_path: Path) -> None:
    problems = check_wheel_dir(tmp_path)
    assert len(problems) == len(wheels()) and all(p.endswith(f"missing in {tmp_path}") for p in problems)
    for version in ("0.1.7", "0.1.6"):
        (tmp_path / f"braceexpand-{version}-py2.py3-none-any.whl").write_bytes(b"")
    problems = check_wheel_dir(tmp_path)
    assert "braceexpand: 2 wheels in " + str(tmp_path) + "; keep one version" in problems


def test_the_images_versions_that_were_read_are_versions() -> None:
    assert IMAGE_VERSIONS["torch"] == Version("2.11.0") and set(IMAGE_VERSIONS) <= IMAGE_PACKAGES
