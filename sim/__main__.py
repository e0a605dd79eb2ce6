"""``python -m sim`` runs the CLI."""

import sys

from sim.cli import main

sys.exit(main())
