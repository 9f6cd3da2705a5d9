"""`python -m server ...` is the `rlgate` command (handy where the console script is not on PATH)."""

import sys

from server.cli import main

sys.exit(main())
