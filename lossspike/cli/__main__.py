"""`python -m lossspike.cli`: the same command line as the `lossspike` script."""

import sys

from lossspike.cli import main

sys.exit(main())
