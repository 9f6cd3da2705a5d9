"""`rlgate serve`: its settings, the run spec it serves and its ports are checked before the server's imports
(torch: ~2 s of a start), so a mistake on the command line or in --config, or a port in use, is answered at once;
the parent of `--workers N` only starts and watches its workers, and never imports the server itself."""

from __future__ import annotations

from rlgate.server.served_spec import served_spec
from rlgate.server.settings import ServerSettings
from rlgate.service.settings import require_device


def main(argv: list[str]) -> int:
    settings = ServerSettings(_cli_parse_args=argv, _cli_prog_name="rlgate serve")
    spec = served_spec(settings, None)
    require_device(settings.device)
    # gRPC's (~0.1 s) only once the settings are good; still no torch.
    from rlgate.server.workers import run_workers
    from rlgate.service.process import ensure_free

    if settings.workers > 1:
        return run_workers(settings, serve_worker)
    ensure_free(settings.host, settings.port, "--port")
    ensure_free(settings.host, settings.http_port, "--http-port")
    from rlgate.server.main import serve  # the server itself, once nothing stands in its way

    return serve(settings, spec)


def serve_worker(settings: ServerSettings) -> None:
    """One worker process (forked by the workers' fork server, which imported this module and the server)."""
    from rlgate.server.main import serve_worker as serve

    serve(settings)
