"""What the warm pool may preload: the modules a kernel has imported, or a script imports at
its top, that are safe to import in the zygote.

Pure choices from names and paths; asking the pool is serving.py's and client.py's concern.
A module is proposed only when its top-level package is

- installed: it comes from site-packages or a PYTHONPATH entry (both part of the pool's
  environment fingerprint). Never the notebook's own `utils.py` next to it: the zygote's
  working directory is '/', and the rank's `sys.path` finds such modules afresh;
- not of the standard library (already as cheap to import as it gets) nor private;
- not on the deny list below: the kernel's own machinery, and packages known to initialise
  an accelerator or start threads when imported;
- not refused before: the zygote itself checks every package it preloads (CUDA initialised,
  a Python thread started) and records a failure, which this module then honours.

The deny list is a shortcut, not the proof: the zygote's check is (zygote.py).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

# Kernel machinery (meaningless, or harmful, outside a kernel) and packages that initialise
# CUDA/XLA or start threads or network clients at import.
DENIED = frozenset(
    {
        "IPython",
        "ipykernel",
        "ipywidgets",
        "comm",
        "debugpy",
        "pydevd",  # debugpy's vendored debugger, imported by ipykernel under these names
        "pydev_ipython",
        "pydevconsole",
        "pydevd_file_utils",
        "pydevd_plugins",
        "pydevd_tracing",
        "pygments",
        "jedi",
        "parso",
        "prompt_toolkit",
        "matplotlib_inline",
        "nest_asyncio",
        "zmq",
        "tornado",
        "traitlets",
        "jupyter_client",
        "jupyter_core",
        "jupyter_server",
        "jupyterlab",
        "jupyterlab_mlcluster",
        "notebook",
        "pynvml",
        "tensorflow",
        "jax",
        "jaxlib",
        "cupy",
        "pycuda",
        "torch_xla",
        "wandb",
        "comet_ml",
        "neptune",
        "clearml",
        "ray",
        "distributed",
    }
)
MAX_MODULES = 4000  # bounds what one submit may ask the pool to import


def allowed_roots(env: Mapping[str, str] | None = None) -> list[str]:
    """Directories a preloadable module may come from: site-packages and PYTHONPATH."""
    import site

    env = os.environ if env is None else env
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    dirs.append(site.getusersitepackages())
    dirs += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [os.path.realpath(d) for d in dirs if os.path.isdir(d)]


def _origin(top: str, module: Any = None) -> str | None:
    """Where a top-level module lives, without importing it when it is not yet imported."""
    if module is not None:
        path = getattr(module, "__file__", None)
        if not path:
            locations = list(getattr(module, "__path__", None) or [])
            path = locations[0] if locations else None
        return path
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        return spec.origin
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else None


def _under(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in roots)


def top_level_problem(
    top: str, module: Any, roots: list[str], refused: Iterable[str] = ()
) -> str | None:
    """Why the package `top` must not be preloaded (None: it may)."""
    if not top.isidentifier() or top.startswith("_"):
        return "private"
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return "standard library"
    if top in DENIED:
        return "on the deny list"
    if top in set(refused):
        return "refused by the warm pool before"
    origin = _origin(top, module)
    if origin is None or not _under(origin, roots):
        return "not an installed package"
    return None


def candidates(
    names: Iterable[str],
    modules: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    refused: Iterable[str] = (),
) -> list[str]:
    """The names (dotted, in the order given) whose package may be preloaded.

    `modules`: the imported module objects by name, when known (a kernel's sys.modules)."""
    roots = allowed_roots(env)
    refused = set(refused)
    verdicts: dict[str, bool] = {}
    chosen: list[str] = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or name in seen:
            continue
        top = name.partition(".")[0]
        if top not in verdicts:
            module = modules.get(top) if modules is not None else None
            verdicts[top] = top_level_problem(top, module, roots, refused) is None
        if verdicts[top] and all(part.isidentifier() for part in name.split(".")):
            seen.add(name)
            chosen.append(name)
            if len(chosen) >= MAX_MODULES:
                break
    return chosen


# kernel_modules' last answer and what it was for: judging every imported module takes ~10 ms
# in a kernel that imported transformers (~2,600 of them), on every cell's critical path,
# though between two cells the kernel rarely imports anything.
_kernel_answer: tuple[Any, list[str]] | None = None


def kernel_modules(refused: Iterable[str] = ()) -> list[str]:
    """What this process (a kernel) has imported that the pool may preload, in import order."""
    global _kernel_answer
    loaded = dict(sys.modules)  # a copy: imports on other threads must not break the walk
    key = (
        frozenset((name, id(module)) for name, module in loaded.items()),
        frozenset(refused),
        os.environ.get("PYTHONPATH", ""),
    )
    if _kernel_answer is None or _kernel_answer[0] != key:
        _kernel_answer = (key, candidates(list(loaded), loaded, refused=refused))
    return list(_kernel_answer[1])


def script_imports(path: str) -> list[str]:
    """The absolute imports at a script's top (module body, also inside a top-level `if` or
    `try`), found by reading it, never by running it. Unreadable or broken: none."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return names


# Calls that import what no import statement names: a job using one may need anything.
_DYNAMIC_IMPORTS = frozenset({"__import__", "import_module", "exec", "eval", "run_path"})


def code_imports(source: str) -> list[str] | None:
    """Every module the code's own import statements name, anywhere in it (inside functions,
    classes, `if` and `try` too), read with `ast`, never run: `import a.b` names a.b,
    `from a import b` names a and a.b (a.b counts only where it is a module: see
    uncovered_needs). Relative imports name the code's own modules, which no generation
    preloads: left out. None when that cannot be known: source ast cannot parse (an IPython
    magic, a `!` line) or that imports dynamically (__import__, importlib.import_module,
    exec, eval, runpy.run_path)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called in _DYNAMIC_IMPORTS:
                return None
    return list(dict.fromkeys(names))


def file_imports(path: str) -> list[str] | None:
    """code_imports of a script's file (None: unreadable, or not knowable)."""
    try:
        with open(path, "rb") as f:
            return code_imports(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def payload_imports(kind: str, source: str, filename: str) -> list[str] | None:
    """code_imports of what a job runs: a cell's source, a script's or a -m module's file;
    None for a callable (its imports are its module's, not known here) or when unknowable."""
    if kind == "code":
        return code_imports(source)
    if kind == "script":
        return file_imports(filename)
    if kind == "module":
        try:
            spec = importlib.util.find_spec(filename)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
        return file_imports(origin) if origin and os.path.isfile(origin) else None
    return None


def script_modules(path: str, refused: Iterable[str] = ()) -> list[str]:
    """What the pool may preload for a script: its top imports that are installed packages."""
    return candidates(script_imports(path), refused=refused)
