"""`python -m rlgate ...` is the `rlgate` command (handy where the console script is not on PATH)."""

import sys

from rlgate.cli.main import main

sys.exit(main())
