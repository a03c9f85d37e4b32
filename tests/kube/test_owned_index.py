"""The controller's mirror of what Notebooks own (notebook_controller/owned.py): each object
under the Notebook it belongs to, a relist of one namespace leaving the others' alone."""

from __future__ import annotations

from notebook_controller.objects import LABEL_NOTEBOOK
from notebook_controller.owned import OwnedIndex, notebook_of


def owned(name: str, namespace: str, notebook: str | None, uid: str, generation: int = 1) -> dict:
    refs = [
        {
            "apiVersion": "mlcluster.io/v1",
            "kind": "Notebook",
            "name": notebook,
            "uid": f"nb-{notebook}",
            "controller": True,
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": generation,
            "ownerReferences": refs if notebook else [],
        },
        "spec": {"ports": [{"port": 80}], "selector": {"app": name}},
    }


def names(index: OwnedIndex, key: tuple[str, str]) -> list[str]:
    return sorted(obj["metadata"]["name"] for obj in index.get(key))


def test_objects_are_kept_under_their_notebook_and_follow_their_owner():
    index = OwnedIndex("Service")
    index.put(owned("a", "ns1", "nb", "u1"))
    index.put(owned("b", "ns1", "nb", "u2"))
    index.put(owned("stray", "ns1", None, "u3"))  # no Notebook owns it: not kept
    assert names(index, ("ns1", "nb")) == ["a", "b"] and len(index) == 2
    assert index.get(("ns1", "other")) == ()
    index.put(owned("b", "ns1", "other", "u2"))  # its ownerReference changed
    assert names(index, ("ns1", "nb")) == ["a"] and names(index, ("ns1", "other")) == ["b"]
    index.remove("u1")
    assert index.get(("ns1", "nb")) == () and list(index) == [("ns1", "other")]
    # What is kept is what the reconcile reads: the spec fields it repairs, packed.
    (kept,) = index.get(("ns1", "other"))
    assert dict(kept["spec"]) == {"ports": [{"port": 80}], "selector": {"app": "b"}}


def test_a_relist_of_one_namespace_replaces_only_that_namespace():
    index = OwnedIndex("Service")
    index.put(owned("a", "ns1", "nb", "u1"))
    index.put(owned("gone", "ns1", "nb", "u2"))
    index.put(owned("c", "ns2", "nb", "u3"))
    index.replace([owned("a", "ns1", "nb", "u1"), owned("new", "ns1", "nb", "u4")], "ns1")
    assert names(index, ("ns1", "nb")) == ["a", "new"]
    assert names(index, ("ns2", "nb")) == ["c"]
    index.replace([owned("d", "ns3", "nb", "u5")])  # "": every namespace
    assert list(index) == [("ns3", "nb")] and len(index) == 1


def test_a_pod_belongs_to_the_notebook_its_label_names():
    pod = {"kind": "Pod", "metadata": {"labels": {LABEL_NOTEBOOK: "nb"}, "ownerReferences": []}}
    assert notebook_of(pod) == "nb"
    assert notebook_of({"kind": "Pod", "metadata": {"labels": {}}}) is None
