"""The pure builders of per-user notebook objects (the API-talking part is tested with the
Kubernetes API emulator in the notebook-controller's suite)."""

from __future__ import annotations

import jsonschema

from jupyterlab_mlcluster.server.notebooks import (
    OWNER_LABEL,
    STOPPED_ANNOTATION,
    notebook_json,
    notebook_object,
    owner_label,
)
from jupyterlab_mlcluster.server.openapi import build_document

LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def test_owner_labels_are_valid_and_distinct():
    users = [
        "alice",
        "alice@example.com",
        "Alice",
        "a" * 200,
        "ünïcode",
        "",
        "-weird-",
        "alice@example.org",
    ]
    labels = [owner_label(u) for u in users]
    assert len(set(labels)) == len(users)
    for label in labels:
        assert len(label) <= 63 and jsonschema.validators.Draft202012Validator(
            {"pattern": LABEL_VALUE}
        ).is_valid(label), label


def test_notebook_object_and_its_rest_shape():
    obj = notebook_object(
        name="nb1",
        namespace="users",
        owner="alice@example.com",
        image="jupyter/lab:4",
        request={"name": "nb1", "cpus": 2, "memory": "4Gi", "gpus": 1, "workspace_size": "10Gi"},
    )
    assert obj["apiVersion"] == "mlcluster.io/v1alpha1" and obj["kind"] == "Notebook"
    assert obj["metadata"]["labels"][OWNER_LABEL] == owner_label("alice@example.com")
    assert obj["spec"]["owner"] == "alice@example.com"
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert obj["spec"]["workspace"] == {"size": "10Gi"}

    obj["metadata"]["annotations"] = {STOPPED_ANNOTATION: "2026-11-22T01:02:03Z"}
    obj["status"] = {"phase": "Stopped", "readyReplicas": 0, "url": "/notebook/users/nb1/"}
    shape = notebook_json(obj)
    schema = {**build_document(max_workers=1)["components"]["schemas"]["Notebook"]}
    jsonschema.validate(shape, schema)
    assert shape["stopped"] and not shape["ready"] and shape["url"] == "/notebook/users/nb1/"
    assert shape["image"] == "jupyter/lab:4"


def test_a_fresh_notebook_without_status():
    obj = notebook_object(
        name="nb2", namespace="ns", owner="bob", image="img", request={"name": "nb2"}
    )
    assert "resources" not in obj["spec"]["template"]["spec"]["containers"][0]
    shape = notebook_json(obj)
    assert (
        shape["phase"] == "Pending" and shape["url"] == "/notebook/ns/nb2/" and not shape["stopped"]
    )
