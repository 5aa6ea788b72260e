"""``python -m neuraldbg``: the command-line interface (:mod:`neuraldbg.cli`)."""

import sys

from neuraldbg.cli import main

sys.exit(main())
