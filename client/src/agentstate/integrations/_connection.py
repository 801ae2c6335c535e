"""What the three adapters share: one constructor shape for reaching the state service,
their lifecycle (close, context managers), and bounded caches.

Every adapter takes exactly one of `address=` ("host:port"), `client=` (an
AsyncStateClient the caller owns and closes) or `settings=` (ClientSettings); LangGraph's
saver and ADK's service also take it as their first positional argument. `security=`
(agentstate.client.tls) sets TLS, a client certificate and a service token for the
connection an adapter opens; ClientSettings carry their own (AGENTSTATE_STATE_TLS_*). A client the
adapter opened is closed by its `close()` / `aclose()`; a client it was given is not.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, Generic, Self, TypeVar

from agentstate.client import AsyncStateClient, ChannelSecurity, ClientSettings, StateClient

K = TypeVar("K")
V = TypeVar("V")

Target = str | AsyncStateClient | StateClient | ClientSettings


class BoundedCache(Generic[K, V]):
    """A mapping that forgets its least recently used entry beyond `limit` (the adapters'
    id caches: a long-lived process meets unboundedly many threads and sessions)."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __setitem__(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)

    def __len__(self) -> int:
        return len(self._items)


class Connection:
    """The state service as an adapter reaches it: given, or opened (and closed) here."""

    def __init__(
        self,
        target: Target | None = None,
        *,
        address: str | None = None,
        client: AsyncStateClient | None = None,
        sync_client: StateClient | None = None,
        settings: ClientSettings | None = None,
        security: ChannelSecurity | None = None,
        who: str,
    ) -> None:
        if isinstance(target, str):
            address = _one(address, target, "address", who)
        elif isinstance(target, AsyncStateClient):
            client = _one(client, target, "client", who)
        elif isinstance(target, StateClient):
            sync_client = _one(sync_client, target, "sync_client", who)
        elif isinstance(target, ClientSettings):
            settings = _one(settings, target, "settings", who)
        elif target is not None:
            raise TypeError(
                f"{who} takes an address (str), an AsyncStateClient or ClientSettings, "
                f"not {type(target).__name__}"
            )
        if address is not None and settings is not None:
            raise ValueError(f"{who}: give an address or settings, not both")
        if address is not None and (not isinstance(address, str) or not address):
            raise ValueError(f"{who}: address must be a non-empty 'host:port' string")
        if address is None and settings is None and client is None and sync_client is None:
            raise ValueError(
                f"{who} needs the state service: address='host:port', client= or settings="
            )
        if security is not None and (client is not None or sync_client is not None):
            raise ValueError(f"{who}: security is for the connection it opens, not a client's")
        if address is not None:
            settings = ClientSettings(state_address=address)
        self._settings = settings
        # TLS for the connections opened here: instead of what `settings` describe.
        self._security = security
        self._given_async = client
        self._given_sync = sync_client
        self._async: AsyncStateClient | None = None
        self._sync: StateClient | None = None

    @property
    def opens(self) -> bool:
        """Whether this adapter opens its own connections (it was given no client)."""
        return self._settings is not None

    def aclient(self) -> AsyncStateClient:
        if self._given_async is not None:
            return self._given_async
        if self._async is None:
            if self._settings is None:
                raise ValueError("this adapter was given a sync client only: use the sync methods")
            # Opens its channels lazily, one per event loop: safe to make outside a loop.
            self._async = AsyncStateClient.from_settings(self._settings, self._security)
        return self._async

    def sync_client(self) -> StateClient:
        if self._given_sync is not None:
            return self._given_sync
        if self._sync is None:
            if self._settings is None:
                raise ValueError("this adapter was given an async client only: use the a* methods")
            self._sync = StateClient.from_settings(self._settings, self._security)
        return self._sync

    async def aclose(self) -> None:
        """Close what this adapter opened (never a client it was given). A later call
        opens a new connection, as SQLiteSession reopens its file."""
        opened, self._async = self._async, None
        if opened is not None:
            await opened.close()
        self._close_sync()

    def close(self) -> None:
        """As aclose, from synchronous code (or from a running loop, where the async
        client's channel of that loop is closed by a task scheduled on it)."""
        opened, self._async = self._async, None
        if opened is not None:
            _run_soon(opened.close())
        self._close_sync()

    def _close_sync(self) -> None:
        opened, self._sync = self._sync, None
        if opened is not None:
            opened.close()


def _one(given: Any, positional: Any, name: str, who: str) -> Any:
    if given is not None:
        raise ValueError(f"{who}: {name} given twice")
    return positional


_background: set[asyncio.Task[None]] = set()


def _run_soon(coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine)  # channels of loops that have ended are only dropped
        return
    task = loop.create_task(coroutine)
    _background.add(task)
    task.add_done_callback(_background.discard)


class ClosesItsConnection:
    """close() / aclose() and both context managers, for an adapter that reaches the
    service through `self._connection`: they close what it opened, never a client it was
    given, and a later call opens a new connection (as SQLiteSession reopens its file).
    (ADK's service has its own: ADK's close() is a coroutine.)"""

    _connection: Connection

    def close(self) -> None:
        self._connection.close()

    async def aclose(self) -> None:
        await self._connection.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
