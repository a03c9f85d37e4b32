"""The layers check themselves: `lint-imports` (pyproject.toml [tool.importlinter]) holds on this
tree, and refuses a copy of it where a module reaches up a layer from inside a function (the
lazy imports that hid the old cycles), where the server imports the notebook-controller, or
where two modules of a package import each other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Check the packages under `root` against the contracts in root/pyproject.toml."""
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_the_layers_hold():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.slow
def test_an_upward_import_breaks_the_layers(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("jupyterlab_mlcluster", "notebook_controller"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    with open(tmp_path / "jupyterlab_mlcluster" / "jobs" / "model.py", "a") as model:
        model.write(
            "\n\ndef _reaches_up():\n"
            "    from ..kernel import magics  # lazy, inside a function: still an import\n\n"
            "    return magics\n"
        )
    with open(tmp_path / "jupyterlab_mlcluster" / "server" / "notebooks.py", "a") as notebooks:
        notebooks.write("\n\nfrom notebook_controller import handlers  # noqa: E402\n")
    kubernetes = tmp_path / "jupyterlab_mlcluster" / "backends" / "kubernetes"
    with open(kubernetes / "trainjob.py", "a") as trainjob:  # objects.py imports trainjob.py
        trainjob.write("\n\nfrom .objects import TRAINJOB_CONTAINER  # noqa: E402\n")

    result = lint_imports(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "0 kept, 3 broken" in result.stdout, result.stdout
    assert "jupyterlab_mlcluster.jobs.model -> jupyterlab_mlcluster.kernel.magics" in result.stdout
    assert "jupyterlab_mlcluster.server.notebooks -> notebook_controller.handlers" in result.stdout
    assert "No cycles are allowed in jupyterlab_mlcluster.backends.kubernetes" in result.stdout
