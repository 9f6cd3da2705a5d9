"""`rlgate serve`: its settings are read before the server's imports (torch, gRPC: ~2 s of a start), so a mistake
on the command line is answered at once."""

from __future__ import annotations

from rlgate.server.settings import ServerSettings


def main(argv: list[str]) -> int:
    settings = ServerSettings(_cli_parse_args=argv, _cli_prog_name="rlgate serve")
    from rlgate.server.main import serve  # the server itself, once its settings are known to be good

    return serve(settings)
