"""`python -m lab.train`: the command line of `lab.train.entry`, alone or under torchrun."""

import sys

from lab.train.entry import main

sys.exit(main())
