"""`agentstate-console`: run the web console.

Settings come from environment variables (console/config.py and docs/reference/settings.md). It logs
"listening on http://HOST:PORT" (https with CONSOLE_TLS_CERT_FILE) once the socket is bound
(port 0 picks one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn

from agentstate.common import telemetry
from agentstate.common.config import ConfigError
from agentstate.common.listen import cannot_listen, reason_of
from agentstate.common.tls import https_context, server_tls
from agentstate.console.app import create_app
from agentstate.console.config import ConsoleSettings

LISTEN_SETTING = "CONSOLE_LISTEN_ADDRESS"


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process would die by
    the signal; a console that shut down cleanly exits 0, like the two services."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


async def serve(settings: ConsoleSettings) -> None:
    host, port = settings.host_port()
    # Bound here, so port 0 works and the address is known before the first request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise cannot_listen(settings.listen_address, LISTEN_SETTING, reason_of(exc)) from None
    # Listening already: a request sent as soon as the address is printed waits in the
    # backlog until uvicorn accepts, instead of being refused.
    sock.listen(128)
    bound_host, bound_port = sock.getsockname()[:2]

    tls = server_tls(
        "CONSOLE", settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
    )
    context = https_context(tls) if tls is not None else None
    scheme = "https" if context is not None else "http"

    def ready() -> None:
        print(f"agentstate-console listening on {scheme}://{bound_host}:{bound_port}", flush=True)

    config = uvicorn.Config(
        create_app(settings, ready),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=2,
        # One context for the process; it swaps in renewed files itself (common/tls.py).
        ssl_context_factory=(lambda *_: context) if context is not None else None,
    )
    await _Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentstate-console", description=__doc__)
    parser.parse_args(argv)
    try:
        telemetry.configure_logging("agentstate-console")
        settings = ConsoleSettings.from_env()
        settings.host_port()
    except (ConfigError, ValueError) as exc:
        print(f"agentstate-console: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings))
    except ConfigError as exc:  # its address cannot be bound
        print(f"agentstate-console: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
