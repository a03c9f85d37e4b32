# The emulator fixtures; importing them first also points $KUBECONFIG at the emulator.
# Then those of the Kubernetes job backend's tests (k8s, player, training_operator, volcano,
# metrics_api).
from tests.kube.fixtures import *
from tests.kube.jobs_fixtures import *
