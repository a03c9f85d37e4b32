"""The images a platform deploys (deploy/images): every image `mlcluster manifests` prints is one
this repository builds, its tag is the package version, and deploy/images/build.sh builds each
Containerfile from the wheel alone under the name the manifests use. (No container engine runs in
the suite: build.sh --dry-run prints its commands; hadolint lints the Containerfiles in
scripts/test.sh; tests/test_wheel_install.py builds and installs that wheel.)"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyterlab_mlcluster._version import __version__
from notebook_controller.cli import print_manifests
from notebook_controller.manifests import DEFAULT_IMAGE

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "deploy" / "images"
REGISTRY = DEFAULT_IMAGE.rsplit("/", 1)[0]


def _container_images(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c["image"] for c in value if "image" in c)
            else:
                yield from _container_images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _container_images(item)


def _containerfile(image: str) -> Path:
    """deploy/images/<repository name>.Containerfile builds <registry>/<repository name>:<tag>."""
    return IMAGES / f"{image.rsplit('/', 1)[1].split(':', 1)[0]}.Containerfile"


@pytest.mark.slow
def test_printed_manifests_name_images_built_here_at_the_package_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Everything the command can print: monitoring, a user namespace, no Gateway (it needs an
    # issuer and runs Istio's own images, not ours).
    assert print_manifests(["--no-gateway", "--monitoring", "--user-namespace=team-a"]) == 0
    images = set(_container_images(list(yaml.safe_load_all(capsys.readouterr().out))))
    assert images, "the manifests name no image"
    for image in images:
        assert image == f"{REGISTRY}/{image.rsplit('/', 1)[1]}", image  # our registry
        assert image.endswith(f":{__version__}"), image
        assert _containerfile(image).is_file(), f"nothing in deploy/images builds {image}"
    # The committed default output names the same.
    shipped = (REPO / "deploy" / "controller" / "manifests.yaml").read_text()
    assert set(_container_images(list(yaml.safe_load_all(shipped)))) <= images


@pytest.mark.slow
def test_build_script_builds_each_containerfile_from_the_wheel_as_the_manifests_name_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=sys.executable, CONTAINER_ENGINE="podman")
    done = subprocess.run(
        ["bash", str(IMAGES / "build.sh"), "--dry-run", "--push"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    # (`jlpm build:prod` comes first only where labextension/ is older than the sidebar's sources.)
    wheel = next(c for c in commands if c[1:4] == ["-m", "pip", "wheel"])
    assert wheel[0] == sys.executable and wheel[4] == "."
    wheels = Path(wheel[wheel.index("-w") + 1])
    assert not wheels.is_relative_to(REPO), wheels
    builds = [c for c in commands if c[:2] == ["podman", "build"]]
    built = {}
    for command in builds:
        assert command[command.index("--build-arg") + 1] == f"VERSION={__version__}"
        image = command[command.index("-t") + 1]
        built[image] = REPO / command[command.index("-f") + 1]
        assert built[image] == _containerfile(image), command
        # The build context is the wheel's folder alone, not the source tree.
        assert Path(command[-1]) == wheels, command
    assert commands.index(wheel) < commands.index(builds[0])
    assert DEFAULT_IMAGE in built
    assert set(built.values()) == set(IMAGES.glob("*.Containerfile"))
    assert all(image.endswith(f":{__version__}") for image in built)
    assert [c[2] for c in commands if c[:2] == ["podman", "push"]] == list(built)


def test_build_script_refuses_an_unknown_option() -> None:
    done = subprocess.run(
        ["bash", str(IMAGES / "build.sh"), "--tag=latest"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown option --tag=latest" in done.stderr
