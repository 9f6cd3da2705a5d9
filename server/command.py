"""`rlgate serve`: its settings and run spec are read before the server's imports (torch, gRPC: ~2 s of a start),
so a mistake on the command line or in --config is answered at once; the parent of `--workers N` only starts and
watches its workers, and never imports the server itself."""

from __future__ import annotations

from rlgate.server.served_spec import served_spec
from rlgate.server.settings import ServerSettings
from rlgate.service.settings import require_device


def main(argv: list[str]) -> int:
    settings = ServerSettings(_cli_parse_args=argv, _cli_prog_name="rlgate serve")
    spec = served_spec(settings, None)
    require_device(settings.device)
    if settings.workers > 1:
        from rlgate.server.workers import run_workers  # gRPC's port reservation: still no torch

        return run_workers(settings, serve_worker)
    from rlgate.server.main import serve  # the server itself, once its settings are known to be good

    return serve(settings, spec)


def serve_worker(settings: ServerSettings) -> None:
    """One worker process (spawned: it imports this module, then the server)."""
    from rlgate.server.main import serve_worker as serve

    serve(settings)
