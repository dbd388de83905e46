"""``python -m disque.console``: the same as the ``disque-console`` script."""

import sys

from .main import main

sys.exit(main())
