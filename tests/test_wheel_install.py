"""The wheel that `pip wheel .` builds installs a working extension: in a fresh virtual
environment, with no source tree on the path, JupyterLab finds the sidebar, Jupyter Server the
server extension, and every new IPython kernel has `%%distributed` without `%load_ext`.

This is what the images (deploy/images) install. The fresh environment holds only the wheel; its
dependencies come from the test environment's site-packages through a `.pth` path line (a plain
path: the .pth files there, such as the editable install's pointer to the checkout, are not
run), so the checkout can never stand in for the package. Jupyter's and IPython's per-user
folders are empty temporary ones, so only what the wheel installed under the fresh prefix counts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from jupyterlab_mlcluster._version import __version__

pytestmark = pytest.mark.slow  # ~15 s: a wheel build, a venv, two listings and a kernel

REPO = Path(__file__).resolve().parents[1]
WHEEL_NAME = f"jupyterlab_mlcluster-{__version__}-py3-none-any.whl"
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the listings colour "enabled" and "OK"


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> str:
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = COLOUR.sub("", done.stdout + done.stderr)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{output}"
    return output


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh environment's python, the environment to run it in, a neutral working dir)"""
    root = tmp_path_factory.mktemp("wheel-install")
    env = {
        key: value
        for key, value in os.environ.items()
        # Nothing that puts the checkout or another Jupyter/IPython setup in front.
        if key not in ("PYTHONPATH", "PYTHONHOME", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH")
        and not key.startswith(("JUPYTER_", "IPYTHON"))
    }
    home = root / "home"
    home.mkdir()
    env.update(
        HOME=str(home),
        JUPYTER_CONFIG_DIR=str(home / "jupyter-config"),
        JUPYTER_DATA_DIR=str(home / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(home / "jupyter-runtime"),
        IPYTHONDIR=str(home / "ipython"),
        MLCLUSTER_STORE_DIR=str(root / "store"),
        MLCLUSTER_WARM_POOL="0",
    )
    work = root / "work"  # the cwd of every command: not the checkout
    work.mkdir()

    # `pip wheel .` exactly as the images' build.sh runs it (the hook reuses a built
    # labextension/, as scripts/setup.sh leaves it; otherwise it builds the sidebar first).
    wheels = root / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(wheels)]
    _run(build, env, work, timeout=600)
    assert [p.name for p in wheels.iterdir()] == [WHEEL_NAME]

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env, work)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    fresh_site = Path(_run([str(python), "-c", where], env, work).strip())
    shared = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    # Appended after the fresh site-packages: the wheel's copy always wins.
    (fresh_site / "zz_test_dependencies.pth").write_text("\n".join(sorted(shared)) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--no-deps", "--no-index", str(wheels / WHEEL_NAME)], env, work)
    return python, env, work


def test_the_package_is_the_wheels_not_the_checkouts(installed) -> None:
    python, env, work = installed
    found = json.loads(
        _run(
            [
                str(python),
                "-c",
                "import json, sys, jupyterlab_mlcluster, notebook_controller; "
                "print(json.dumps([sys.prefix, jupyterlab_mlcluster.__file__, "
                "notebook_controller.__file__, jupyterlab_mlcluster.__version__, sys.path]))",
            ],
            env,
            work,
        ).strip()
    )
    prefix, package, controller, version, path = found
    venv = python.parent.parent
    assert Path(prefix) == venv
    assert Path(package).is_relative_to(venv), package
    assert Path(controller).is_relative_to(venv), controller
    assert version == __version__
    assert str(REPO) not in path, path


def test_jupyterlab_finds_the_sidebar_enabled(installed) -> None:
    python, env, work = installed
    listing = _run([str(python), "-m", "jupyterlab.labextensions", "list"], env, work)
    venv_dir = str(python.parent.parent / "share" / "jupyter" / "labextensions")
    assert venv_dir in listing, listing
    lines = listing.splitlines()
    ours = [line for line in lines if line.split()[:1] == ["jupyterlab-mlcluster"]]
    assert len(ours) == 1, listing
    assert f"v{__version__}" in ours[0] and "enabled" in ours[0] and "OK" in ours[0], listing
    # Listed under the fresh prefix's folder, not another.
    headers = [i for i, line in enumerate(lines) if not line.startswith(" ") and line.strip()]
    section = max(i for i in headers if i < lines.index(ours[0]))
    assert venv_dir in lines[section], listing


def test_jupyter_server_finds_the_server_extension_enabled(installed) -> None:
    python, env, work = installed
    listing = _run(
        [str(python), "-m", "jupyter_server.extension.serverextension", "list"], env, work
    )
    venv_config = str(python.parent.parent / "etc" / "jupyter")
    lines = [line.strip() for line in listing.splitlines()]
    start = next(i for i, line in enumerate(lines) if line == f"Config dir: {venv_config}")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("Config dir:")), len(lines)
    )
    section = lines[start + 1 : end]
    assert "jupyterlab_mlcluster enabled" in section, listing
    # Validating imports it: it loads from the wheel's files.
    assert f"jupyterlab_mlcluster {__version__} OK" in section, listing


def test_a_new_kernel_has_the_distributed_magic_without_load_ext(installed) -> None:
    python, env, work = installed
    # The kernel is the fresh environment's own python (a spec in the empty per-user data
    # folder, so no other python3 spec on this machine is used).
    spec = Path(env["JUPYTER_DATA_DIR"]) / "kernels" / "wheel-python"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "language": "python", "display_name": "wheel"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    driver = textwrap.dedent(
        """
        import json
        from jupyter_client.manager import start_new_kernel

        km, kc = start_new_kernel(kernel_name="wheel-python", startup_timeout=120)
        try:
            code = (
                "import json, sys, jupyterlab_mlcluster as m; ip = get_ipython(); "
                "print(json.dumps({'cell': sorted(ip.magics_manager.magics['cell']), "
                "'loaded': sorted(ip.extension_manager.loaded), 'prefix': sys.prefix, "
                "'file': m.__file__}))"
            )
            out = []
            reply = kc.execute_interactive(
                code,
                timeout=120,
                output_hook=lambda msg: out.append(msg["content"].get("text", "")),
            )
            assert reply["content"]["status"] == "ok", reply["content"]
            print("RESULT " + "".join(out).strip())
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        """
    )
    output = _run([str(python), "-c", driver], env, work)
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    venv = python.parent.parent
    assert Path(result["prefix"]) == venv
    assert Path(result["file"]).is_relative_to(venv)
    assert "distributed" in result["cell"], result
    assert "jupyterlab_mlcluster" in result["loaded"], result


def test_the_cli_from_the_wheel_prints_manifests_naming_its_own_version(installed) -> None:
    python, env, work = installed
    # The console script the images' commands run (`mlcluster controller`, `mlcluster ...`).
    printed = _run([str(python.parent / "mlcluster"), "manifests", "--no-gateway"], env, work)
    assert f"ghcr.io/jupyterlab-mlcluster/jupyterlab-mlcluster:{__version__}" in printed
