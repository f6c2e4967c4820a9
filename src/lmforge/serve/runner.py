"""Running the app with uvicorn until SIGTERM or Ctrl-C, and shutting down cleanly (exit status 0).

uvicorn re-raises the signal it caught once it has shut down, so a SIGTERM would end the process with
status 143; here a signal only starts the shutdown.  The shutdown stops the running generations at their
next token (their clients get 503, or an error event on a stream), lets other requests finish (at most
``GRACE_S`` seconds), and returns.  A second Ctrl-C exits at once.
"""

from __future__ import annotations

import signal
from pathlib import Path

from .guard import ServeAccess, is_wildcard, loopback_hosts
from .requests import ServeLimits

#: how long the shutdown waits for requests in flight
GRACE_S = 20


def access_for(host: str, api_key: str | None = None, allowed_hosts: tuple[str, ...] = (),
               allow_origins: tuple[str, ...] = ()) -> ServeAccess:
    """The :class:`ServeAccess` of a server bound to ``host``: the Host names that address answers for."""
    return ServeAccess(
        api_key=api_key,
        allowed_hosts=loopback_hosts(host, allowed_hosts),
        allow_ip_literals=is_wildcard(host),
        allow_origins=allow_origins,
    )


def serve(app, host: str, port: int) -> None:
    """Serve ``app`` (from :func:`lmforge.serve.create_app`) on ``host:port`` until SIGTERM / SIGINT."""
    import uvicorn

    generations = app.state.server.generations

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            generations.stop_all()
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=GRACE_S
    )
    Server(config).run()


def run_server(
    paths: list[str | Path],
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServeLimits | None = None,
    api_key: str | None = None,
    device: str | None = None,
) -> None:
    """Load ``paths`` on ``device`` and serve them with uvicorn until SIGTERM or Ctrl-C (Host names checked for
    ``host``); ``device`` as :func:`lmforge.serve.create_app` takes it."""
    from .app import create_app

    serve(create_app(paths, limits, access_for(host, api_key), device), host, port)
