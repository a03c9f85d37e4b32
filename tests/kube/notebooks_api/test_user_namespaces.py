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
import json
from collections.abc import Iterator
from typing import Any

import pytest

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


@pytest.fixture
def namespaces(kube: Kube) -> Iterator[list[str]]:
    """Namespaces a test makes (as `mlcluster manifests --user-namespace` would), deleted after."""
    made: list[str] = []
    yield made
    for name in made:
        kube.delete("v1", "Namespace", name)


def user_namespace_for(kube: Kube, made: list[str], template: str, user: str) -> str:
    name = template_namespace(user, template)
    kube.create_namespace(name)
    made.append(name)
    return name


async def call_with_query(
    user: User, method: str, *path: str, params: dict[str, str], body: Any = None
) -> int:
    """A REST call with a query string (jp_fetch escapes one written into the path)."""
    response = await user.fetch(
        "mlcluster",
        "api",
        *path,
        method=method,
        params=params,
        body=json.dumps(body) if body is not None else ("" if method == "POST" else None),
        headers=dict(user.headers),
        raise_error=False,
        allow_nonstandard_methods=True,
    )
    return response.code


def stored(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in kube.list(NB, "Notebook", namespace)}


def test_bob_cannot_reach_alices_notebooks_even_naming_her_namespace(
    kube: Kube,
    kube_namespace: str,
    namespaces,
    template,
    mlc,
    jp_fetch,
    jp_ws_fetch,
    run,
) -> None:
    install_crds(kube)
    alice_ns = user_namespace_for(kube, namespaces, template, ALICE)
    bob_ns = user_namespace_for(kube, namespaces, template, BOB)
    alice, bob = User(jp_fetch, jp_ws_fetch, ALICE), User(jp_fetch, jp_ws_fetch, BOB)
    assert mlc.per_user_namespaces

    async def scenario() -> None:
        await alice.connect()
        await bob.connect()
        status, made, _ = await alice.call("POST", "notebooks", body={"name": "secret"})
        assert status == 201 and documented("Notebook", made)["namespace"] == alice_ns
        assert made["url"] == f"/notebook/{alice_ns}/secret/"
        # The same name is no clash any more: each user's own namespace.
        for user in (alice, bob):
            status, made, _ = await user.call("POST", "notebooks", body={"name": "nb1"})
            assert status == 201, made
        await alice.until(notebook("secret"))
        await bob.until(notebook("nb1"))
        before = await blocking(stored, kube, alice_ns)
        assert sorted(before) == ["nb1", "secret"]
        assert sorted(await blocking(stored, kube, bob_ns)) == ["nb1"]

        # Bob, by name: alice's notebook is as missing as a name nobody uses.
        for method, path in [
            ("GET", ("notebooks", "secret")),
            ("POST", ("notebooks", "secret", "stop")),
            ("POST", ("notebooks", "secret", "start")),
            ("DELETE", ("notebooks", "secret")),
        ]:
            status, error, _ = await bob.call(method, *path)
            assert status == 404, (method, path, status, error)
        # Bob's nb1 is his own: stopping and deleting it leaves alice's nb1 alone.
        status, stopped, _ = await bob.call("POST", "notebooks", "nb1", "stop")
        assert status == 200 and stopped["stopped"] and stopped["namespace"] == bob_ns
        assert (await bob.call("DELETE", "notebooks", "nb1"))[0] == 204
        # Bob, naming her namespace: no route takes one, in the path, query or body.
        guess = {"namespace": alice_ns}
        for method, path in [
            ("GET", ("notebooks", "secret")),
            ("POST", ("notebooks", "secret", "stop")),
            ("POST", ("notebooks", "secret", "start")),
            ("DELETE", ("notebooks", "secret")),
            ("POST", ("notebooks", "nb1", "stop")),  # alice's nb1; bob's own is gone
        ]:
            status = await call_with_query(bob, method, *path, params=guess)
            assert status == 404, (method, path, status)
        status, listed, _ = await bob.call("GET", "notebooks")
        assert [n["name"] for n in listed["notebooks"]] == [], listed
        assert await call_with_query(bob, "GET", "notebooks", params=guess) == 200
        status, error, _ = await bob.call(
            "POST", "notebooks", body={"name": "planted", "namespace": alice_ns}
        )
        assert status == 400, error  # a field the API does not know: refused, nothing made
        status = await call_with_query(bob, "POST", "notebooks", params=guess, body={"name": "p2"})
        assert status == 201
        assert await blocking(kube.find, NB, "Notebook", "p2", alice_ns) is None
        assert (await blocking(kube.get, NB, "Notebook", "p2", bob_ns))["spec"]["owner"] == BOB
        assert await blocking(kube.find, NB, "Notebook", "planted", alice_ns) is None

        # Alice's objects are exactly as they were: same uid, same resourceVersion.
        after = await blocking(stored, kube, alice_ns)
        assert {
            k: (v["metadata"]["uid"], v["metadata"]["resourceVersion"]) for k, v in after.items()
        } == {
            k: (v["metadata"]["uid"], v["metadata"]["resourceVersion"]) for k, v in before.items()
        }
        status, listed, _ = await alice.call("GET", "notebooks")
        assert sorted(n["name"] for n in listed["notebooks"]) == ["nb1", "secret"]
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
    kube: Kube,
    namespaces,
    template,
    mlc,
    jp_fetch,
    jp_ws_fetch,
    run,
) -> None:
    install_crds(kube)
    plain, dotted = "a-b-x", "a.b@x"
    plain_ns = user_namespace_for(kube, namespaces, template, plain)
    dotted_ns = user_namespace_for(kube, namespaces, template, dotted)
    assert plain_ns != dotted_ns and dotted_ns.startswith(plain_ns + "-")
    users = {name: User(jp_fetch, jp_ws_fetch, name) for name in (plain, dotted)}

    async def scenario() -> None:
        for name, user in users.items():
            status, made, _ = await user.call("POST", "notebooks", body={"name": "nb1"})
            assert status == 201 and made["owner"] == name, made
        assert (await blocking(kube.get, NB, "Notebook", "nb1", plain_ns))["spec"]["owner"] == plain
        assert (await blocking(kube.get, NB, "Notebook", "nb1", dotted_ns))["spec"][
            "owner"
        ] == dotted
        # Each stops only its own.
        status, stopped, _ = await users[dotted].call("POST", "notebooks", "nb1", "stop")
        assert status == 200 and stopped["namespace"] == dotted_ns
        status, listed, _ = await users[plain].call("GET", "notebooks")
        assert [(n["namespace"], n["stopped"]) for n in listed["notebooks"]] == [(plain_ns, False)]

    run(scenario())


def test_a_notebook_planted_for_alice_in_bobs_namespace_reaches_nobody(
    kube: Kube,
    namespaces,
    template,
    mlc,
    jp_fetch,
    jp_ws_fetch,
    run,
) -> None:
    """Bob, with kubectl in his own namespace, makes a Notebook whose spec.owner is alice (his
    code, her identity): alice neither sees it over REST nor hears of it on /events."""
    install_crds(kube)
    alice_ns = user_namespace_for(kube, namespaces, template, ALICE)
    bob_ns = user_namespace_for(kube, namespaces, template, BOB)
    alice = User(jp_fetch, jp_ws_fetch, ALICE)

    async def scenario() -> None:
        await alice.connect()
        planted = notebook_resource("trap", bob_ns, ALICE, labels={OWNER_LABEL: owner_label(ALICE)})
        await blocking(kube.create, planted)
        status, made, _ = await alice.call("POST", "notebooks", body={"name": "mine"})
        assert status == 201 and made["namespace"] == alice_ns
        await alice.until(notebook("mine"))
        assert {m.get("notebook", m).get("name") for m in await alice.notebook_messages()} == {
            "mine"
        }
        status, listed, _ = await alice.call("GET", "notebooks")
        assert [n["name"] for n in listed["notebooks"]] == ["mine"]
        assert (await alice.call("GET", "notebooks", "trap"))[0] == 404

    run(scenario())


def test_a_profile_the_user_owns_is_where_the_notebooks_go(
    kube: Kube,
    kube_namespace: str,
    namespaces,
    template,
    mlc,
    jp_fetch,
    jp_ws_fetch,
    run,
) -> None:
    """Kubeflow's Profile CRD (as published) served: alice owns Profile `<ns>-team`, so her
    notebooks go there; carol owns none, so hers follow the template."""
    install_crds(kube)
    kube.install_crd(profile_crd())
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
        kube.create_namespace(team)
        namespaces.append(team)
        carol_ns = user_namespace_for(kube, namespaces, template, "carol")
        alice, carol = User(jp_fetch, jp_ws_fetch, ALICE), User(jp_fetch, jp_ws_fetch, "carol")

        async def scenario() -> None:
            status, made, _ = await alice.call("POST", "notebooks", body={"name": "nb1"})
            assert status == 201 and made["namespace"] == team, made
            status, made, _ = await carol.call("POST", "notebooks", body={"name": "nb1"})
            assert status == 201 and made["namespace"] == carol_ns, made
            status, listed, _ = await carol.call("GET", "notebooks")
            assert [n["namespace"] for n in listed["notebooks"]] == [carol_ns]

        run(scenario())
    finally:
        kube.delete("kubeflow.org/v1", "Profile", team)
        kube.uninstall_crd(profile_crd()["metadata"]["name"])


def test_profiles_forbidden_to_the_server_only_matter_where_they_exist(
    kube: Kube, kube_namespace: str, namespaces, template, mlc, jp_fetch, jp_ws_fetch, run
) -> None:
    """A server that may not list Profiles (403 whether or not the CRD exists) still uses the
    template where no Profile CRD is served; where one is, it refuses (the cluster's 403, passed
    on as 502) rather than guess."""
    install_crds(kube)
    erin_ns = user_namespace_for(kube, namespaces, template, "erin")
    erin = User(jp_fetch, jp_ws_fetch, "erin")
    profiles = "/apis/kubeflow.org/v1/profiles"
    kube.on_emulator(lambda e: e["get", profiles] << 403)
    try:

        async def without_crd() -> None:
            status, made, _ = await erin.call("POST", "notebooks", body={"name": "nb1"})
            assert status == 201 and made["namespace"] == erin_ns, made

        run(without_crd())
        kube.install_crd(profile_crd())
        mlc.notebooks.namespace_of.ttl = 0  # read again now

        async def with_crd() -> None:
            status, error, _ = await erin.call("POST", "notebooks", body={"name": "nb2"})
            assert status == 502 and "403 Forbidden" in error["message"], error
            assert await blocking(kube.find, NB, "Notebook", "nb2", erin_ns) is None

        run(with_crd())
    finally:
        kube.on_emulator(lambda e: e.remove_reactions())
        kube.uninstall_crd(profile_crd()["metadata"]["name"])


def test_a_missing_user_namespace_is_a_clear_error_and_makes_nothing(
    kube: Kube,
    template,
    mlc,
    jp_fetch,
    jp_ws_fetch,
    run,
) -> None:
    install_crds(kube)
    dave = User(jp_fetch, jp_ws_fetch, "dave")

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
