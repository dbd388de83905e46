"""``python -m disque.cli``: the same as the ``disque`` script."""

import sys

from .main import main

sys.exit(main())
