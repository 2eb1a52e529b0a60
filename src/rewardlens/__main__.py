"""`python -m rewardlens`: the command line, as the `rewardlens` script runs it."""

import sys

from .cli import main

sys.exit(main())
