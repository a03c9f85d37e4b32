"""The notebook-controller: per-user JupyterLab servers behind Istio, from Notebook resources.

``crd`` (the Notebook CRD), ``objects`` (pure builders and status), ``handlers`` (kopf),
``culling`` (idle detection), ``kube`` (API calls), ``config`` (settings), ``manifests``
(what a platform team applies), ``cli`` (``mlcluster controller`` / ``mlcluster manifests``).
"""
