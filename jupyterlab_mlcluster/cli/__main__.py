"""`python -m jupyterlab_mlcluster.cli`: `mlcluster`."""

import sys

from . import main

sys.exit(main())
