# First: importing the emulator fixtures points $KUBECONFIG at the emulator, and the kubernetes
# client reads that variable when it is imported (kopf and the controller import it).
from tests.kube.fixtures import *  # noqa: I001

# The Kubernetes job backend's tests: k8s, player, training_operator, volcano, metrics_api.
from tests.kube.jobs_fixtures import *

from collections.abc import Callable
from typing import Any

import pytest

from tests.kube.controller_support import install_crds, running_controller
from tests.kube.helpers import Kube


@pytest.fixture
def controller(kube: Kube, kube_namespace: str) -> Callable[..., Any]:
    """``with controller(**settings):`` runs the notebook-controller (kopf) on kube_namespace."""
    install_crds(kube)
    return lambda **settings: running_controller(kube_namespace, **settings)
