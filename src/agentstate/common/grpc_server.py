"""gRPC server plumbing shared by both services: options, health, reflection, signals."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agentstate.common.admission import Admission, AdmissionInterceptor
from agentstate.common.listen import cannot_listen
from agentstate.common.reflection import enable_documented_reflection
from agentstate.common.request_decoding import DecodeErrorsAsInvalidArgument
from agentstate.common.tls import ServerTls, server_credentials

# The asyncio health servicer; grpcio-health-checking ships no type hints for it.
AsyncHealthServicer: Any = health.aio.HealthServicer  # type: ignore[attr-defined]

log = logging.getLogger(__name__)


def create_server(
    *,
    max_message_bytes: int,
    interceptors: Sequence[Any] = (),
    max_connection_age_seconds: float = 0.0,
    admission: Admission | None = None,
    reuse_port: bool = False,
    max_metadata_bytes: int = 0,
) -> grpc.aio.Server:
    """`max_connection_age_seconds` > 0: each client connection is closed (GOAWAY, in-flight
    calls finish) after that long, so clients of several replicas re-resolve the name and
    find replicas added since (k8s/overlays/central).

    `admission`: calls beyond its limits are refused (agentstate.common.admission).
    `reuse_port`: SO_REUSEPORT, so that worker processes (agentstate.common.workers) bind
    one port and the kernel spreads the connections over them; off otherwise, so that a
    second server on a port in use fails instead of silently sharing it.
    `max_metadata_bytes` > 0: request metadata up to that size reaches the handlers (the
    agent's authentication refuses an oversized token itself, with a reason)."""
    age: list[tuple[str, int]] = []
    if max_connection_age_seconds > 0:
        age = [
            ("grpc.max_connection_age_ms", int(max_connection_age_seconds * 1000)),
            ("grpc.max_connection_age_grace_ms", 10_000),
        ]
    metadata: list[tuple[str, int]] = []
    if max_metadata_bytes > 0:
        metadata = [
            ("grpc.max_metadata_size", max_metadata_bytes),
            ("grpc.absolute_max_metadata_size", max_metadata_bytes),
        ]
    # Innermost: undecodable requests are INVALID_ARGUMENT before any servicer runs.
    # Admission sits just outside it, after everything that looks at a call's metadata
    # (it caches one guarded handler per method).
    admit = [AdmissionInterceptor(admission)] if admission is not None else []
    chain = [*interceptors, *admit, DecodeErrorsAsInvalidArgument()]
    # The innermost run of guards that decide by method alone (a `wrap`) are put around
    # each handler as it is registered, in the same order, instead of intercepting every
    # call: grpc.aio awaits each interceptor on every call (about 15 us of CPU a call on
    # the benchmark machine, docs/benchmarks.md). Those before them (tracing) stay
    # interceptors, outside them as before.
    split = len(chain)
    while split > 0 and callable(getattr(chain[split - 1], "wrap", None)):
        split -= 1
    server = grpc.aio.server(
        interceptors=chain[:split],
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            *age,
            *metadata,
        ],
    )
    _wrap_registrations(server, chain[split:])
    return server


Wrap = Callable[[Any, str], Any]


def _wrap_registrations(server: Any, guards: Sequence[Any]) -> None:
    """Every handler registered on `server` from now on is `guards[0].wrap(guards[1].wrap(
    ... handler))`, built once when it is registered: the first guard is the outermost,
    as the first interceptor would be."""
    if not guards:
        return
    wraps: list[Wrap] = [guard.wrap for guard in reversed(guards)]

    def wrapped(handler: Any, method: str) -> Any:
        for wrap in wraps:
            handler = wrap(handler, method)
        return handler

    add_generic = server.add_generic_rpc_handlers
    add_registered = server.add_registered_method_handlers

    def add_generic_rpc_handlers(handlers: Sequence[Any]) -> None:
        add_generic(tuple(_WrappedGeneric(h, wrapped) for h in handlers))

    def add_registered_method_handlers(service: str, handlers: dict[str, Any]) -> None:
        add_registered(
            service, {name: wrapped(h, f"/{service}/{name}") for name, h in handlers.items()}
        )

    # The server's own methods, shadowed on this instance: grpc.aio has no hook between
    # a handler's registration and its first call other than an interceptor.
    server.add_generic_rpc_handlers = add_generic_rpc_handlers
    server.add_registered_method_handlers = add_registered_method_handlers


class _WrappedGeneric(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """A generic handler whose method handlers are wrapped, each once (and again only
    if the inner handler answers a method with a different handler)."""

    def __init__(self, inner: Any, wrapped: Wrap) -> None:
        self._inner = inner
        self._wrapped = wrapped
        self._cache: dict[str, tuple[Any, Any]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler: Any = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method)
        cached = self._cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._wrapped(handler, method)
        self._cache[method] = (handler, guarded)
        return guarded


def bind(
    server: grpc.aio.Server, address: str, setting: str = "", tls: ServerTls | None = None
) -> str:
    """Listen on host:port (port 0 picks a free one) or unix:///path; return the real address.
    ConfigError naming `setting` (the variable that holds the address) when it cannot.
    `tls`: serve TLS (mTLS with a client CA), the files reloaded when they change."""
    credentials = server_credentials(tls) if tls is not None else None
    try:
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # "Failed to bind": gRPC does not say why (its log line does)
        raise cannot_listen(address, setting, "gRPC could not bind it") from None
    if address.startswith("unix:"):
        return address
    if port == 0:
        raise cannot_listen(address, setting, "gRPC could not bind it")
    host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


def add_health_and_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> Any:
    """Serve grpc.health.v1 (overall and per service) and server reflection (with the
    contract's comments, so `grpcurl describe` shows the docs)."""
    names = list(service_names)
    health_servicer = AsyncHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_documented_reflection(
        server, [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
    )
    return health_servicer


async def set_serving(health_servicer: Any, names: Iterable[str], *, serving: bool = True) -> None:
    """SERVING (or NOT_SERVING) overall ("") and for each service; ignored once the
    servicer has entered graceful shutdown."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ["", *names]:
        await health_servicer.set(name, status)


def install_stop_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGTERM or SIGINT (the first one; a second one is left to the default)."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s: shutting down gracefully", sig.name)
        stop.set()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(s)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
