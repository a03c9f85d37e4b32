"""The shared server never runs data as code (issue 22): nothing it calls unpickles.

Unpickling runs whatever the pickle's author chose; a job's result (and a trial's value) is
written by the job's owner, so a server that unpickled it would run any user's code as the
server, which many users share. Two tests: one walks the call graph of the package from every
function of `server/` and finds no pickle load on the way; one plays Bob, whose result runs a
command when unpickled, against a real server (REST result route and sweep listing).
"""

from __future__ import annotations

import ast
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "jupyterlab_mlcluster"

# Calls that turn bytes into objects by running constructors the bytes name.
UNPICKLING_MODULES = {"pickle", "cloudpickle", "_pickle", "dill", "torch", "joblib"}
UNPICKLING_CALLS = {"load", "loads", "Unpickler"}

# Where the server may reach an unpickling function on purpose, and why it is no way in.
ALLOWED = {
    # Firing a local schedule submits its stored payload as a local job, whose code runs as
    # this server's Unix user anyway: only where local jobs run here (one user's server, or
    # allow_local_jobs_when_shared); a shared server fires none (test_no_local_schedule_is_fired).
    "jobs/experiments/scheduler.py:Scheduler._submit",
    # A local job's rank, forked from the warm pool: the process that runs the job's own code
    # (local backend, the same places as above).
    "jobs/warm/rank.py:become_rank",
}
# Processes the server starts run as its user too: the walk starts from them as well.
STARTED_PROCESSES = (
    "jobs/running/supervisor.py:<module>",
    "jobs/running/fleet.py:<module>",
)


class Definition:
    """A function, method or class of the package, and the names its code mentions."""

    def __init__(self, key: str, module: str, node: ast.AST, cls: str | None):
        self.key = key  # 'path:Qual.name'
        self.module = module  # 'jobs/service.py'
        self.node = node
        self.cls = cls  # key of the class a method belongs to
        self.names: set[str] = set()  # plain names (resolved in its module)
        self.module_attrs: set[tuple[str, str]] = set()  # (module alias, attribute)
        self.self_attrs: set[str] = set()  # self.x / cls.x
        self.other_attrs: set[str] = set()  # x.y on anything else
        self.unpickles = False


class Package:
    """Every definition of the package, with each module's imports, for a call graph by
    rapid type analysis: a name resolves through the module's imports; `self.m` to the
    methods `m` of its class's hierarchy; `obj.m` on anything else to the methods `m` of every
    class that reachable code names (instantiates, subclasses or passes)."""

    def __init__(self) -> None:
        self.defs: dict[str, Definition] = {}
        self.module_names: dict[str, dict[str, str]] = defaultdict(dict)  # name -> key
        self.aliases: dict[str, dict[str, str]] = defaultdict(dict)  # name -> key or module
        self.methods: dict[str, dict[str, str]] = defaultdict(dict)  # class -> name -> key
        self.bases: dict[str, list[str]] = defaultdict(list)
        for path in sorted(PACKAGE.rglob("*.py")):
            self._read(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text()))
        for names in self.aliases.values():
            for name, target in list(names.items()):
                names[name] = self._resolve_import(target)
        for key, d in self.defs.items():
            if isinstance(d.node, ast.ClassDef):
                for base in d.node.bases:
                    if isinstance(base, ast.Name):
                        target = self.resolve_name(d.module, base.id)
                        if target in self.methods:
                            self.bases[key].append(target)

    def _resolve_import(self, target: str) -> str:
        """'module.py:name' -> the definition's key, or 'module.py' for a module."""
        module, _, name = target.partition(":")
        if name and f"{module}:{name}" in self.defs:
            return f"{module}:{name}"
        if name:
            sub = module.removesuffix("__init__.py") + name
            if (PACKAGE / f"{sub}.py").exists():
                return f"{sub}.py"
            if (PACKAGE / sub / "__init__.py").exists():
                return f"{sub}/__init__.py"
            return self.aliases.get(module, {}).get(name, "")  # re-exported
        return module

    def _read(self, module: str, tree: ast.Module) -> None:
        _ModuleReader(self, module, tree).read()

    def resolve_name(self, module: str, name: str) -> str:
        return self.module_names[module].get(name) or self.aliases[module].get(name, "")

    def hierarchy(self, cls: str) -> set[str]:
        """The class, its package bases and its package subclasses."""
        up, todo = set(), [cls]
        while todo:
            c = todo.pop()
            if c not in up:
                up.add(c)
                todo += self.bases.get(c, [])
        down = {c for c in self.methods if up & set(self._ancestors(c))}
        return up | down

    def _ancestors(self, cls: str) -> list[str]:
        out, todo = [], [cls]
        while todo:
            c = todo.pop()
            out.append(c)
            todo += self.bases.get(c, [])
        return out


class _ModuleReader:
    """One module read into the Package: its relative imports, and its definitions with the
    names each one's code mentions."""

    def __init__(self, pkg: Package, module: str, tree: ast.Module) -> None:
        self.pkg = pkg
        self.module = module
        self.tree = tree
        self.package = module.split("/")[:-1]
        self.pickle_aliases = _pickle_aliases(tree)
        _note_libraries(tree, self.pickle_aliases)

    def read(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                self._relative_import(node)
        key = f"{self.module}:<module>"
        root = self.pkg.defs[key] = Definition(key, self.module, self.tree, None)
        self._visit(self.tree, "", root, None)

    def _relative_import(self, node: ast.ImportFrom) -> None:
        package = self.package
        base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        parts = [*base, *(node.module.split(".") if node.module else [])]
        stem = "/".join(parts)
        target_module = (
            f"{stem}.py"
            if (PACKAGE / f"{stem}.py").exists()
            else (f"{stem}/__init__.py" if stem else "__init__.py")
        )
        for alias in node.names:
            sub = f"{stem}/{alias.name}" if stem else alias.name
            if (PACKAGE / f"{sub}.py").exists():  # `from . import module`
                target = f"{sub}.py"
            elif (PACKAGE / sub / "__init__.py").exists():  # `from .. import package`
                target = f"{sub}/__init__.py"
            else:
                target = f"{target_module}:{alias.name}"
            self.pkg.aliases[self.module][alias.asname or alias.name] = target

    def _visit(self, node: ast.AST, prefix: str, owner: Definition, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._define(child, prefix, owner, cls)
                continue
            if isinstance(child, ast.ImportFrom) and child.level:
                # Importing a module runs its top level (the walk follows it there).
                owner.names.update(alias.asname or alias.name for alias in child.names)
            _note(child, owner, self.pickle_aliases)
            self._visit(child, prefix, owner, cls)

    def _define(
        self,
        child: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        prefix: str,
        owner: Definition,
        cls: str | None,
    ) -> None:
        pkg, module = self.pkg, self.module
        key = f"{module}:{prefix}{child.name}"
        is_class = isinstance(child, ast.ClassDef)
        d = pkg.defs[key] = Definition(key, module, child, None if is_class else cls)
        pkg.module_names[module].setdefault(child.name, key)
        if cls is not None and not is_class:
            pkg.methods[cls][child.name] = key
        if is_class:
            pkg.methods.setdefault(key, {})
        for decorator in getattr(child, "decorator_list", []):
            _note(decorator, owner, self.pickle_aliases)
            self._visit(decorator, prefix, owner, cls)
        body = ast.Module(body=child.body, type_ignores=[])
        self._visit(body, f"{prefix}{child.name}.", d, key if is_class else None)
        if isinstance(child, ast.ClassDef):
            for b in child.bases:
                _note(b, owner, self.pickle_aliases)


def _note_libraries(tree: ast.AST, pickle_aliases: dict[str, str]) -> None:
    """Names bound to other libraries (json, os, tornado's web): `json.loads` is theirs."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("jupyterlab_mlcluster"):
                    pickle_aliases.setdefault(alias.asname or alias.name.split(".")[0], "lib")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("jupyterlab_mlcluster"):
                for alias in node.names:
                    pickle_aliases.setdefault(alias.asname or alias.name, "lib")


def _note(node: ast.AST, d: Definition, pickle_aliases: dict[str, str]) -> None:
    if isinstance(node, ast.Attribute):
        base = node.value
        if isinstance(base, ast.Name):
            if base.id in ("self", "cls"):
                d.self_attrs.add(node.attr)
            elif pickle_aliases.get(base.id) not in ("lib", "module"):
                d.module_attrs.add((base.id, node.attr))
                d.other_attrs.add(node.attr)
            if node.attr in UNPICKLING_CALLS and pickle_aliases.get(base.id) == "module":
                d.unpickles = True
        else:
            d.other_attrs.add(node.attr)
    elif isinstance(node, ast.Name):
        d.names.add(node.id)
        if pickle_aliases.get(node.id) == "call":
            d.unpickles = True


def _pickle_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to an unpickling module or function (`import pickle as p`,
    `from pickle import loads`)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNPICKLING_MODULES:
                    aliases[alias.asname or alias.name.split(".")[0]] = "module"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in UNPICKLING_MODULES:
                for alias in node.names:
                    if alias.name in UNPICKLING_CALLS:
                        aliases[alias.asname or alias.name] = "call"
    return aliases


def reachable_unpicklers(
    package: Package | None = None, gates: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Each unpickling definition the server's code can reach -> one path to it (not going
    on through `gates`)."""
    pkg = package or Package()
    paths = _Walk(pkg, gates).run()
    return {k: p for k, p in paths.items() if pkg.defs[k].unpickles}


class _Walk:
    """The walk from the server's definitions: one path to each definition it reaches."""

    def __init__(self, pkg: Package, gates: frozenset[str]) -> None:
        self.pkg = pkg
        self.gates = gates
        roots = [k for k in pkg.defs if k.startswith("server/") or k in STARTED_PROCESSES]
        self.paths: dict[str, list[str]] = {k: [k] for k in roots}
        self.live: set[str] = set()  # classes reachable code names
        self.wanted: dict[str, list[str]] = defaultdict(list)  # method name -> keys wanting it
        self.queue = list(roots)

    def run(self) -> dict[str, list[str]]:
        while self.queue:
            key = self.queue.pop()
            if key not in self.gates:
                self._follow(key, self.pkg.defs[key])
        return self.paths

    def reach(self, target: str, via: str) -> None:
        if target and target in self.pkg.defs and target not in self.paths:
            self.paths[target] = [*self.paths[via], target]
            self.queue.append(target)

    def make_live(self, cls: str, via: str) -> None:
        wanted = self.wanted
        for c in self.pkg._ancestors(cls):
            if c in self.live:
                continue
            self.live.add(c)
            for name, method in self.pkg.methods.get(c, {}).items():
                if name.startswith("__") or name in wanted:
                    self.reach(method, wanted[name][0] if name in wanted else via)

    def _follow(self, key: str, d: Definition) -> None:
        pkg = self.pkg
        for name in d.names:
            target = pkg.resolve_name(d.module, name)
            if target.endswith(".py"):  # a module: its top level (the backends package
                target = f"{target}:<module>"  # registers the backends get_backend calls there)
            self.reach(target, key)
            if target in pkg.methods:
                self.make_live(target, key)
        for alias, attr in d.module_attrs:
            module = pkg.resolve_name(d.module, alias)
            if module.endswith(".py"):
                target = pkg.module_names[module].get(attr, "")
                self.reach(target, key)
                if target in pkg.methods:
                    self.make_live(target, key)
        if d.cls is not None or isinstance(d.node, ast.ClassDef):
            for c in pkg.hierarchy(d.cls or key):
                for attr in d.self_attrs:
                    self.reach(pkg.methods.get(c, {}).get(attr, ""), key)
        for attr in d.other_attrs:
            self.wanted[attr].append(key)
            for c in self.live:
                self.reach(pkg.methods.get(c, {}).get(attr, ""), key)


def test_no_function_the_server_can_reach_unpickles():
    package = Package()
    found = reachable_unpicklers(package, gates=frozenset(ALLOWED))
    # The analysis sees unpickling where there is some (else it would prove nothing) ...
    assert package.defs["jobs/results.py:JobResults.unpickle"].unpickles
    assert package.defs["runtime/payload.py:Payload.loads"].unpickles
    # ... and reaches through the layers the server stands on, the backends included (found
    # through the registry their package fills when the server imports it).
    reached = _reached(package)
    assert "jobs/service.py:JobService.result_data" in reached
    assert "backends/local/backend.py:LocalBackend.run" in reached
    assert "backends/kubernetes/backend.py:KubernetesBackend.run" in reached
    assert {k: " -> ".join(p) for k, p in found.items()} == {}
    # Without the gate the walk does find the schedule's payload (so the gate is needed).
    assert "runtime/payload.py:Payload.loads" in reachable_unpicklers(package)


def _reached(package: Package) -> set[str]:
    """Every definition reachable from the server (the same walk, all of it)."""
    saved = {k: d.unpickles for k, d in package.defs.items()}
    for d in package.defs.values():
        d.unpickles = True
    try:
        return set(reachable_unpicklers(package))
    finally:
        for k, d in package.defs.items():
            d.unpickles = saved[k]


# -- Bob's result runs a command when unpickled -------------------------------------------

BOB = "bob@example.com"


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    # Local jobs on a header-identified server (the opt-out), so Bob's job needs no cluster;
    # what is checked is what the server process does with what the job wrote.
    return {"MLClusterApp": {"trust_identity_header": True, "allow_local_jobs_when_shared": True}}


def _bobs_code(marker: Path) -> str:
    # The object's unpickling calls os.system: a pickle's __reduce__ chooses what runs.
    return (
        "import os\n"
        "class Payload:\n"
        "    def __reduce__(self):\n"
        f"        return (os.system, ('touch {marker}',))\n"
        "Payload()\n"
    )


async def _call(jp_fetch, method: str, *path: str, body: Any = None):
    response = await jp_fetch(
        "mlcluster",
        "api",
        *path,
        method=method,
        body=json.dumps(body) if body is not None else None,
        headers={"kubeflow-userid": BOB},
        raise_error=False,
    )
    return response.code, json.loads(response.body or b"null")


async def _until_final(jp_fetch, job_id: str) -> dict[str, Any]:
    import asyncio

    deadline = time.monotonic() + 120
    while True:
        status, job = await _call(jp_fetch, "GET", "jobs", job_id)
        assert status == 200, job
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)


async def test_attack_result_that_runs_code_when_unpickled_is_not_unpickled_by_the_server(
    jp_fetch, mlc, tmp_path
):
    marker = tmp_path / "ran-as-the-server"
    status, job = await _call(
        jp_fetch, "POST", "jobs", body={"code": _bobs_code(marker), "backend": "local"}
    )
    assert status == 201, job
    job = await _until_final(jp_fetch, job["id"])
    assert job["state"] == "succeeded" and job["has_result"], job
    assert not marker.exists()  # the rank pickled it; nobody has unpickled it yet

    status, body = await _call(jp_fetch, "GET", "jobs", job["id"], "result")
    assert status == 409, body
    assert "no JSON form" in body["message"] and "Payload" in body["message"], body
    assert not marker.exists(), "the server unpickled Bob's result and ran his command"

    # The owner's own process reads the real object (and so runs the command: it is his).
    from jupyterlab_mlcluster.jobs.service import JobService

    JobService(config=mlc.mlconfig).result(job["id"])
    assert marker.exists()


async def test_attack_sweep_trial_value_that_runs_code_is_not_unpickled_by_the_server(
    jp_fetch, mlc, tmp_path
):
    """The sweep listing shows each trial's metric, read from the trial's result: as data."""
    import asyncio

    from jupyterlab_mlcluster.jobs.experiments.sweep import submit_sweep
    from jupyterlab_mlcluster.jobs.experiments.sweeps import parse_sweep
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    marker = tmp_path / "ran-as-the-server"
    code = _bobs_code(marker).replace("Payload()\n", "{'loss': Payload() if x == 1 else 1 / x}\n")
    sweep = await asyncio.to_thread(
        submit_sweep,
        mlc.service,
        JobSpec.from_options({"framework": "none", "backend": "local"}),
        Payload(kind="code", source=code),
        parse_sweep(["x=1,2"], metric="loss", parallel=2),
        origin={"kind": "test", "user": BOB},
    )
    await asyncio.to_thread(sweep.wait, 120)
    for path in (("sweeps",), ("sweeps", sweep.id)):
        status, body = await _call(jp_fetch, "GET", *path)
        assert status == 200, body
        one = body["sweeps"][0] if "sweeps" in body else body
        assert [t["state"] for t in one["trials"]] == ["succeeded", "succeeded"], one
        # Trial 1's metric is data; trial 0's has no JSON form, so no metric (not run).
        assert [t["metric"] for t in one["trials"]] == [None, 0.5], one
        assert not marker.exists(), "the server unpickled a trial's value and ran Bob's command"
