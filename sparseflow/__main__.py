"""``python -m sparseflow ...``: the same as the ``sparseflow`` command."""

import sys

from sparseflow.cli import main

sys.exit(main())
