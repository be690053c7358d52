"""`python -m lab.cli`: the `forma` command line."""

import sys

from lab.cli.parser import main

sys.exit(main())
