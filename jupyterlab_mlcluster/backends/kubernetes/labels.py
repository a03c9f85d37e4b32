"""The labels and annotations on a job's Kubernetes objects: ours (who made it, for whom,
which attempt) and those the controllers set on pods (which rank a pod runs). Both builders
use them: objects.py (which imports trainjob.py for the TrainJob engine, and names them for
its readers) and trainjob.py, which so no longer imports objects.py."""

from __future__ import annotations

MANAGED_BY = "jupyterlab-mlcluster"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB_ID = "mlcluster.io/job-id"
LABEL_USER = "mlcluster.io/user"
ANNOTATION_USER = "mlcluster.io/user"
ANNOTATION_NAME = "mlcluster.io/name"
ANNOTATION_ATTEMPT = "mlcluster.io/attempt"

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"

# Set on pods by the Job controller and the Training Operator; they say which rank a pod is.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
