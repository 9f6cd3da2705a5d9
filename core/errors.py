"""`UserError`: a mistake the person running rlgate can fix (a flag, a file, an address, a busy port).

Any layer raises it (or a subclass) with a message that says what is wrong and how to fix it; the
command line prints that message as one line and exits 2, with no traceback (cli/main.py).
"""


class UserError(Exception):
    """A user's mistake: `str(error)` is the whole message a person needs."""
