# The emulator fixtures; importing them first also points $KUBECONFIG at the emulator.
from tests.kube.fixtures import *  # noqa: F401,F403
