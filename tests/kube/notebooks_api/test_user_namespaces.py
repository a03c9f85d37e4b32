"""Each user's notebook servers in the user's own namespace, played as attacks: the server
extension (in-process Jupyter server) against the Kubernetes API emulator, identity from the
`kubeflow-userid` header, no `notebook_namespace` override, so each user's namespace comes
from a Profile the user owns or from `user_namespace_template`.

User B (bob) tries to list, read, stop, start and delete user A's (alice's) notebooks, by name
and by naming her namespace; a user whose name sanitises like another's gets a namespace of
their own; a Notebook planted in bob's namespace naming alice as its owner reaches nobody.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jupyterlab_mlcluster.notebook_resource import KUBEFLOW_OWNER_ANNOTATION, OWNER_ANNOTATION
from jupyterlab_mlcluster.server.app import MLClusterApp
from jupyterlab_mlcluster.server.notebooks import OWNER_LABEL, owner_label
from jupyterlab_mlcluster.server.user_namespace import template_namespace
from notebook_controller.objects import notebook_resource
from tests.kube.controller_support import NB, install_crds
from tests.kube.crds import UPSTREAM
from tests.kube.helpers import Kube
from tests.kube.notebooks_api.test_notebooks_api import (
    User,
    blocking,
    describe,
    documented,
    notebook,
)

ALICE, BOB = "alice", "bob"


@functools.cache
def profile_crd() -> dict[str, Any]:
    """Kubeflow's Profile CRD as published (tests/kube/upstream/kubeflow-profiles)."""
    import yaml

    text = UPSTREAM.joinpath("kubeflow-profiles", "kubeflow.org_profiles.yaml").read_text()
    return yaml.safe_load(text)


@pytest.fixture
def template(kube_namespace: str) -> str:
    """This test's own namespaces: `<kube_namespace>-<user>` (the emulator is shared)."""
    return f"{kube_namespace}-{{user}}"


@pytest.fixture
def jp_server_config(store_dir, monkeypatch, template):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    return {
        "ServerApp": {"jpserver_extensions": {"jupyterlab_mlcluster": True}},
        "MLClusterApp": {"trust_identity_header": True, "user_namespace_template": template},
        "IdentityProvider": {"cookie_name": "mlcluster-test-user"},
    }


class Tenants:
    """This test's users, and their namespaces made as `mlcluster manifests --user-namespace`
    would make them (deleted after the test)."""

    def __init__(self, kube: Kube, template: str, jp_fetch: Any, jp_ws_fetch: Any) -> None:
        self.kube, self.template = kube, template
        self.fetch, self.ws_fetch = jp_fetch, jp_ws_fetch
        self.made: list[str] = []

    def user(self, name: str) -> User:
        return User(self.fetch, self.ws_fetch, name)

    def namespace(self, name: str, annotations: dict[str, str] | None = None) -> str:
        """Namespace `name`, made; `annotations`: e.g. whose it is, as Kubeflow's profile
        controller (`owner`) or `mlcluster manifests --namespace-owner` would mark it."""
        self.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "annotations": dict(annotations or {})},
            }
        )
        self.made.append(name)
        return name

    def namespace_of(self, user: str) -> str:
        """The namespace `user_namespace_template` names for `user`, made."""
        return self.namespace(template_namespace(user, self.template))


@pytest.fixture
def tenants(kube: Kube, template: str, mlc, jp_fetch, jp_ws_fetch) -> Iterator[Tenants]:
    """The running server (its CRDs installed) and this test's users and namespaces."""
    install_crds(kube)
    tenants = Tenants(kube, template, jp_fetch, jp_ws_fetch)
    yield tenants
    for name in tenants.made:
        kube.delete("v1", "Namespace", name)


@pytest.fixture
def profiles(kube: Kube) -> Iterator[Callable[[], Any]]:
    """Installs Kubeflow's Profile CRD when called; uninstalled after the test."""
    yield lambda: kube.install_crd(profile_crd())
    kube.uninstall_crd(profile_crd()["metadata"]["name"])


async def call_with_query(
    user: User, method: str, *path: str, params: dict[str, str], body: Any = None
) -> int:
    """A REST call's status, with a query string (jp_fetch escapes one written into the path)."""
    status, _, _ = await user.call(method, *path, params=params, body=body)
    return status


async def create(user: User, name: str) -> dict[str, Any]:
    """`user` makes notebook `name`: the made notebook, as the document describes it."""
    status, made, _ = await user.call("POST", "notebooks", body={"name": name})
    assert status == 201 and made["owner"] == user.name, (status, made)
    return documented("Notebook", made)


def stored(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in kube.list(NB, "Notebook", namespace)}


async def owner_of(kube: Kube, name: str, namespace: str) -> str:
    return (await blocking(kube.get, NB, "Notebook", name, namespace))["spec"]["owner"]


def names(listed: dict[str, Any]) -> list[str]:
    return [n["name"] for n in listed["notebooks"]]


def test_bob_cannot_reach_alices_notebooks_even_naming_her_namespace(
    kube: Kube, tenants: Tenants, mlc, run
) -> None:
    alice_ns, bob_ns = tenants.namespace_of(ALICE), tenants.namespace_of(BOB)
    alice, bob = tenants.user(ALICE), tenants.user(BOB)
    assert mlc.per_user_namespaces

    async def scenario() -> None:
        await alice.connect()
        await bob.connect()
        made = await create(alice, "secret")
        assert made["namespace"] == alice_ns and made["url"] == f"/notebook/{alice_ns}/secret/"
        # The same name is no clash any more: each user's own namespace.
        for user in (alice, bob):
            await create(user, "nb1")
        await alice.until(notebook("secret"))
        await bob.until(notebook("nb1"))
        before = await blocking(stored, kube, alice_ns)
        assert sorted(before) == ["nb1", "secret"]
        assert sorted(await blocking(stored, kube, bob_ns)) == ["nb1"]

        # Bob, by name: alice's notebook is as missing as a name nobody uses.
        on_secret = [
            ("GET", ("notebooks", "secret")),
            ("POST", ("notebooks", "secret", "stop")),
            ("POST", ("notebooks", "secret", "start")),
            ("DELETE", ("notebooks", "secret")),
        ]
        for method, path in on_secret:
            status, error, _ = await bob.call(method, *path)
            assert status == 404, (method, path, status, error)
        # Bob's nb1 is his own: stopping and deleting it leaves alice's nb1 alone.
        status, stopped, _ = await bob.call("POST", "notebooks", "nb1", "stop")
        assert status == 200 and stopped["stopped"] and stopped["namespace"] == bob_ns
        assert (await bob.call("DELETE", "notebooks", "nb1"))[0] == 204
        # Bob, naming her namespace: no route takes one, in the path, query or body.
        guess = {"namespace": alice_ns}
        alices_nb1 = ("POST", ("notebooks", "nb1", "stop"))  # bob's own is gone
        for method, path in [*on_secret, alices_nb1]:
            status = await call_with_query(bob, method, *path, params=guess)
            assert status == 404, (method, path, status)
        status, listed, _ = await bob.call("GET", "notebooks")
        assert names(listed) == [], listed
        assert await call_with_query(bob, "GET", "notebooks", params=guess) == 200
        status, error, _ = await bob.call(
            "POST", "notebooks", body={"name": "planted", "namespace": alice_ns}
        )
        assert status == 400, error  # a field the API does not know: refused, nothing made
        status = await call_with_query(bob, "POST", "notebooks", params=guess, body={"name": "p2"})
        assert status == 201
        assert await blocking(kube.find, NB, "Notebook", "p2", alice_ns) is None
        assert await owner_of(kube, "p2", bob_ns) == BOB
        assert await blocking(kube.find, NB, "Notebook", "planted", alice_ns) is None

        # Alice's objects are exactly as they were: same uid, same resourceVersion.
        def versions(objects: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
            return {
                k: (v["metadata"]["uid"], v["metadata"]["resourceVersion"])
                for k, v in objects.items()
            }

        assert versions(await blocking(stored, kube, alice_ns)) == versions(before)
        status, listed, _ = await alice.call("GET", "notebooks")
        assert sorted(names(listed)) == ["nb1", "secret"]
        assert all(n["namespace"] == alice_ns and not n["stopped"] for n in listed["notebooks"])

        # /events: each hears only of their own, though both had an nb1.
        alice_saw = await alice.notebook_messages()
        bob_saw = await bob.notebook_messages()
        assert all(m.get("notebook", {}).get("owner", ALICE) == ALICE for m in alice_saw)
        assert {m.get("notebook", m).get("name") for m in alice_saw} == {"secret", "nb1"}
        assert {m.get("notebook", m).get("name") for m in bob_saw} == {"nb1", "p2"}, [
            describe(m) for m in bob_saw
        ]
        assert not any(m["type"] == "notebook_deleted" for m in alice_saw), "bob's delete"

    run(scenario())


def test_a_name_that_sanitises_like_another_users_gets_its_own_namespace(
    kube: Kube, tenants: Tenants, run
) -> None:
    plain, dotted = "a-b-x", "a.b@x"
    plain_ns, dotted_ns = tenants.namespace_of(plain), tenants.namespace_of(dotted)
    assert plain_ns != dotted_ns and dotted_ns.startswith(plain_ns + "-")
    users = {name: tenants.user(name) for name in (plain, dotted)}

    async def scenario() -> None:
        for user in users.values():
            await create(user, "nb1")
        assert await owner_of(kube, "nb1", plain_ns) == plain
        assert await owner_of(kube, "nb1", dotted_ns) == dotted
        # Each stops only its own.
        status, stopped, _ = await users[dotted].call("POST", "notebooks", "nb1", "stop")
        assert status == 200 and stopped["namespace"] == dotted_ns
        status, listed, _ = await users[plain].call("GET", "notebooks")
        assert [(n["namespace"], n["stopped"]) for n in listed["notebooks"]] == [(plain_ns, False)]

    run(scenario())


def test_a_notebook_planted_for_alice_in_bobs_namespace_reaches_nobody(
    kube: Kube, tenants: Tenants, run
) -> None:
    """Bob, with kubectl in his own namespace, makes a Notebook whose spec.owner is alice (his
    code, her identity): alice neither sees it over REST nor hears of it on /events."""
    alice_ns, bob_ns = tenants.namespace_of(ALICE), tenants.namespace_of(BOB)
    alice = tenants.user(ALICE)

    async def scenario() -> None:
        await alice.connect()
        planted = notebook_resource("trap", bob_ns, ALICE, labels={OWNER_LABEL: owner_label(ALICE)})
        await blocking(kube.create, planted)
        assert (await create(alice, "mine"))["namespace"] == alice_ns
        await alice.until(notebook("mine"))
        heard = {m.get("notebook", m).get("name") for m in await alice.notebook_messages()}
        assert heard == {"mine"}
        status, listed, _ = await alice.call("GET", "notebooks")
        assert names(listed) == ["mine"]
        assert (await alice.call("GET", "notebooks", "trap"))[0] == 404

    run(scenario())


def test_a_profile_the_user_owns_is_where_the_notebooks_go(
    kube: Kube, kube_namespace: str, tenants: Tenants, profiles, run
) -> None:
    """Kubeflow's Profile CRD (as published) served: alice owns Profile `<ns>-team`, so her
    notebooks go there; carol owns none, so hers follow the template."""
    profiles()
    team = f"{kube_namespace}-team"
    try:
        kube.create(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Profile",
                "metadata": {"name": team},
                "spec": {"owner": {"kind": "User", "name": ALICE}},
            }
        )
        tenants.namespace(team, {KUBEFLOW_OWNER_ANNOTATION: ALICE})  # Kubeflow made it hers
        carol_ns = tenants.namespace_of("carol")
        alice, carol = tenants.user(ALICE), tenants.user("carol")

        async def scenario() -> None:
            assert (await create(alice, "nb1"))["namespace"] == team
            assert (await create(carol, "nb1"))["namespace"] == carol_ns
            status, listed, _ = await carol.call("GET", "notebooks")
            assert [n["namespace"] for n in listed["notebooks"]] == [carol_ns]

        run(scenario())
    finally:
        kube.delete("kubeflow.org/v1", "Profile", team)


def test_attack_squatting_a_users_template_namespace_with_a_profile(
    kube: Kube, kube_namespace: str, tenants: Tenants, profiles, run
) -> None:
    """Bob registers a Profile named after the namespace alice's template gives her (she owns
    no Profile): her notebooks and jobs would land where Bob rules. Refused (403, saying
    why), nothing made there; Bob's own calls are untouched."""
    profiles()
    squatted = template_namespace(ALICE, tenants.template)
    try:
        kube.create(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Profile",
                "metadata": {"name": squatted},
                "spec": {"owner": {"kind": "User", "name": BOB}},
            }
        )
        # Bob's Profile came first: Kubeflow made the namespace, his.
        tenants.namespace(squatted, {KUBEFLOW_OWNER_ANNOTATION: BOB})
        alice, bob = tenants.user(ALICE), tenants.user(BOB)

        async def scenario() -> None:
            for method, path, body in [
                ("POST", ("notebooks",), {"name": "nb1"}),
                ("GET", ("notebooks",), None),
                ("POST", ("jobs",), {"code": "1", "backend": "kubernetes"}),
            ]:
                status, error, _ = await alice.call(method, *path, body=body)
                assert status == 403 and "does not own" in error["message"], (path, error)
            assert await blocking(stored, kube, squatted) == {}
            assert await blocking(kube.list, "batch/v1", "Job", squatted) == []
            # Bob's own Profile is his namespace: he works there as before.
            assert (await create(bob, "nb1"))["namespace"] == squatted

        run(scenario())
    finally:
        kube.delete("kubeflow.org/v1", "Profile", squatted)


def profile(name: str, owner: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Profile",
        "metadata": {"name": name},
        "spec": {"owner": {"kind": "User", "name": owner}},
    }


def test_attack_a_profile_named_after_anothers_existing_namespace_maps_nobody_there(
    kube: Kube, kube_namespace: str, tenants: Tenants, profiles, run
) -> None:
    """Issue 31, 1: Bob creates Profiles named after namespaces that are already Alice's: her
    template namespace, and a team namespace (`--user-namespace T --namespace-owner
    T=alice`, both marked `mlcluster.io/owner: alice`). Kubeflow refuses to adopt an existing
    namespace, but the Profiles stay; the server mapped Bob into Alice's namespace (his jobs
    could mount her workspaces) and answered Alice 403. A Profile counts only where the
    Namespace agrees: Bob is refused (403 saying why), nothing of his lands there, and Alice
    works on in her namespace."""
    profiles()
    alice_ns = tenants.namespace_of(ALICE)
    kube.patch(
        "v1", "Namespace", alice_ns, {"metadata": {"annotations": {OWNER_ANNOTATION: ALICE}}}
    )
    team = tenants.namespace(f"{kube_namespace}-team", {OWNER_ANNOTATION: ALICE})
    try:
        for name in (alice_ns, team):
            kube.create(profile(name, BOB))
        alice, bob = tenants.user(ALICE), tenants.user(BOB)

        async def scenario() -> None:
            for method, path, body in [
                ("POST", ("notebooks",), {"name": "nb1"}),
                ("GET", ("notebooks",), None),
                ("POST", ("jobs",), {"code": "1", "backend": "kubernetes"}),
            ]:
                status, error, _ = await bob.call(method, *path, body=body)
                assert status == 403, (path, status, error)
                # ...saying why: whose each namespace is, by which mark.
                for name in (alice_ns, team):
                    assert f"namespace {name!r} belongs to {ALICE!r}" in error["message"], error
            for name in (alice_ns, team):
                assert await blocking(stored, kube, name) == {}
                assert await blocking(kube.list, "batch/v1", "Job", name) == []
            # Alice is untouched: no 403, her notebook in her namespace.
            assert (await create(alice, "mine"))["namespace"] == alice_ns
            status, listed, _ = await alice.call("GET", "notebooks")
            assert status == 200 and names(listed) == ["mine"]

        run(scenario())
    finally:
        for name in (alice_ns, team):
            kube.delete("kubeflow.org/v1", "Profile", name)


def test_profiles_forbidden_to_the_server_only_matter_where_they_exist(
    kube: Kube, tenants: Tenants, profiles, mlc, run
) -> None:
    """A server that may not list Profiles (403 whether or not the CRD exists) still uses the
    template where no Profile CRD is served; where one is, it refuses (the cluster's 403, passed
    on as 502) rather than guess."""
    erin_ns = tenants.namespace_of("erin")
    erin = tenants.user("erin")
    kube.on_emulator(lambda e: e["get", "/apis/kubeflow.org/v1/profiles"] << 403)
    try:

        async def without_crd() -> None:
            assert (await create(erin, "nb1"))["namespace"] == erin_ns

        run(without_crd())
        profiles()
        mlc.notebooks.namespace_of.ttl = 0  # read again now

        async def with_crd() -> None:
            status, error, _ = await erin.call("POST", "notebooks", body={"name": "nb2"})
            assert status == 502 and "403 Forbidden" in error["message"], error
            assert await blocking(kube.find, NB, "Notebook", "nb2", erin_ns) is None

        run(with_crd())
    finally:
        kube.on_emulator(lambda e: e.remove_reactions())


def test_a_missing_user_namespace_is_a_clear_error_and_makes_nothing(
    tenants: Tenants, template, run
) -> None:
    dave = tenants.user("dave")

    async def scenario() -> None:
        status, error, _ = await dave.call("POST", "notebooks", body={"name": "nb1"})
        assert status >= 400 and template_namespace("dave", template) in error["message"], error
        status, listed, _ = await dave.call("GET", "notebooks")
        assert (status, listed) == (200, {"notebooks": []})

    run(scenario())


@pytest.mark.parametrize(
    ("settings", "per_user"),
    [
        ({"trust_identity_header": True}, True),
        ({"trust_identity_header": True, "notebook_namespace": "shared"}, False),
        ({}, False),
        ({"notebook_namespace": "shared"}, False),
    ],
)
def test_the_rule_for_per_user_namespaces(settings: dict[str, Any], per_user: bool) -> None:
    assert MLClusterApp(**settings).per_user_namespaces is per_user


def test_a_bad_template_is_refused_at_configuration() -> None:
    from traitlets import TraitError

    with pytest.raises(TraitError, match="exactly once"):
        MLClusterApp(user_namespace_template="{user}-{other}")
