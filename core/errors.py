"""`UserError`: a mistake the person running rlgate can fix (a flag, a file, an address, a busy port).

Any layer raises it (or a subclass) with a message that says what is wrong and how to fix it; the
command line prints that message as one line and exits 2, with no traceback (cli/main.py).
"""

import argparse
from typing import NoReturn


class UserError(Exception):
    """A user's mistake: `str(error)` is the whole message a person needs."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse for a subcommand's flags, whose mistakes are UserErrors: one line `rlgate: ...` and exit 2,
    as for the subcommands whose flags pydantic-settings parses, instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)

    def add_allow_import(self) -> None:
        """--allow-import MODULE (repeatable): where the code a checkpoint's run spec names may be imported from."""
        self.add_argument(
            "--allow-import",
            action="append",
            default=[],
            metavar="MODULE",
            help="a module the checkpoint's run spec may name code in (repeatable)",
        )
