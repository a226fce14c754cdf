"""``python -m perf``: see ``perf.cli``."""

import sys

from perf.cli import main

sys.exit(main())
