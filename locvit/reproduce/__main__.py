"""``python -m locvit.reproduce PLAN --minutes=M --workdir=DIR``: see ``locvit.reproduce``."""

import sys

from absl import logging

from locvit.reproduce import main

logging.set_verbosity(logging.WARNING)
sys.exit(main())
