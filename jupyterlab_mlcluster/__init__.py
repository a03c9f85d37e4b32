"""jupyterlab-mlcluster: distributed training a cell away."""

from ._version import __version__

__all__ = ["__version__"]
