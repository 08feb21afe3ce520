"""``python -m kdtree_parity.promote``."""

import sys

from kdtree_parity.promote.cli import main

sys.exit(main())
