"""An OpenAI Agents SDK `Session` kept in the state service.

    state = AsyncStateClient.connect("127.0.0.1:50051")
    session = AgentStateSession("support-42", client=state, user_id="alice")
    await Runner.run(agent, "Where is my order?", session=session)

The session's items are the items of one conversation of `user_id`, found by the external
key "openai:<session_id>" (created on first use; two processes starting the same session at
once get the same conversation). Semantics are those of the SDK's SQLiteSession: items in
the order added, `get_items(limit)` the newest `limit` oldest first, `pop_item` removes and
returns the newest, `clear_session` removes them all (and the conversation). What the
SQLite file does not give: `add_items` from any number of processes or hosts all land
(each call is one transaction under the conversation's lock), the items go with
DeleteConversation in one transaction, and a service in another language reads them over
gRPC (ListItems).

`ttl_seconds=` gives the session's conversation a time to live: fixed from its creation,
or with `ttl_renewed_by_writes=True` renewed by each add_items and pop_item; the service's
retention sweep deletes it once expired (a running turn spared), and the session then
starts afresh.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from agentstate.client.aio import AsyncStateClient
from agentstate.client.errors import InvalidArgument, NotFound, PayloadTooLarge
from agentstate.client.settings import ClientSettings
from agentstate.client.tls import ChannelSecurity
from agentstate.client.types import Item, NewItem
from agentstate.integrations._connection import ClosesItsConnection, Connection
from agentstate.integrations._ttl import time_to_live

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

KEY_PREFIX = "openai:"
MAX_SESSION_ID_CHARS = 256 - len(KEY_PREFIX)  # external keys are at most 256 characters
MAX_ITEMS_PER_CALL = 1000  # AppendItems' limit
PAGE_SIZE = 1000  # items per ListItems page (a page must fit one gRPC message)


def session_key(session_id: str) -> str:
    """The conversation external key of an OpenAI Agents session."""
    return KEY_PREFIX + session_id


class AgentStateSession(ClosesItsConnection, SessionABC):
    """A `Session` whose items live in the state service (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        *,
        user_id: str,
        client: AsyncStateClient | None = None,
        address: str | None = None,
        settings: ClientSettings | None = None,
        session_settings: SessionSettings | None = None,
        security: ChannelSecurity | None = None,
        ttl_seconds: int | None = None,
        ttl_renewed_by_writes: bool = False,
    ) -> None:
        """One of `client=` (an AsyncStateClient, yours to close), `address=` or
        `settings=` (a connection this session opens and `close()` closes); `security`:
        TLS for that connection (agentstate.client.tls). `ttl_seconds`: the time to live
        of the conversation this session creates (None: none), renewed by each write with
        `ttl_renewed_by_writes`; ValueError when not a positive int (or over the service's
        ten years, at the first write)."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        if len(session_id) > MAX_SESSION_ID_CHARS or "\x00" in session_id:
            raise ValueError(
                f"session_id must be at most {MAX_SESSION_ID_CHARS} characters without NUL"
            )
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("user_id must be a non-empty string")
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()
        self.user_id = user_id
        self.ttl = time_to_live(ttl_seconds, ttl_renewed_by_writes)
        self._connection = Connection(
            client, address=address, settings=settings, security=security, who="AgentStateSession"
        )
        self._conversation_id: str | None = None
        self._cached: _Cached | None = None

    @property
    def _client(self) -> AsyncStateClient:
        return self._connection.aclient()

    @property
    def key(self) -> str:
        return session_key(self.session_id)

    async def conversation_id(self, *, create: bool = True) -> str | None:
        """The conversation holding this session's items (None: none yet, and not `create`)."""
        if self._conversation_id is None:
            try:
                resolved = await self._client.resolve_conversation(
                    self.user_id,
                    self.key,
                    create=create,
                    title=self.session_id[:200],
                    ttl_seconds=self.ttl.seconds if self.ttl else None,
                    ttl_renewed_by_writes=self.ttl.renewed_by_writes if self.ttl else False,
                )
            except NotFound:
                return None
            except InvalidArgument as exc:
                raise ValueError(f"invalid session: {exc.message}") from exc
            self._conversation_id = resolved.conversation.conversation_id
        return self._conversation_id

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest `limit` items oldest first; all of them when `limit` is None (or the
        session settings' limit) or negative, none when it is 0 (as SQLiteSession)."""
        wanted = resolve_session_limit(limit, self.session_settings)
        last_n = wanted if wanted is not None and wanted >= 0 else None
        if last_n == 0:
            return []
        for _ in range(2):
            try:
                texts = await self._read(last_n)
            except NotFound:
                # The conversation this session knew was deleted (clear_session or
                # DeleteConversation from elsewhere). The key may already name a new one,
                # started by another session object's add_items: look it up once more.
                # Not found again is an empty session, as SQLiteSession has for an id
                # without rows.
                self._forget()
                continue
            return [cast("TResponseInputItem", json.loads(text)) for text in texts]
        return []

    def _forget(self) -> None:
        self._conversation_id = None
        self._cached = None

    async def _read(self, last_n: int | None) -> list[bytes]:
        """The items' texts, oldest first. The session keeps the texts of every item up
        to the revision it last saw, and then reads only the items since: when they are
        exactly the seqs that revision and the new one span (nothing popped or cleared
        meanwhile: each append's items take the revisions it makes as their seqs), the
        kept texts are still the session's. Otherwise it reads everything again."""
        conversation_id = await self.conversation_id(create=False)
        if conversation_id is None:
            return []
        cached = self._cached
        if cached is not None and cached.conversation_id == conversation_id:
            page = await self._client.list_items(
                self.user_id, conversation_id, page_size=PAGE_SIZE, after_seq=cached.revision
            )
            if not page.next_page_token and cached.extend(page.items, page.revision):
                return cached.items[-last_n:] if last_n is not None else list(cached.items)
            self._cached = None
        items, single_page, revision = await self._list(conversation_id, last_n)
        texts = [item.item_json for item in items]
        if last_n is None and single_page:
            self._cached = _Cached(conversation_id, revision, list(texts))
        return texts

    async def _list(self, conversation_id: str, last_n: int | None) -> tuple[list[Item], bool, int]:
        """The items, whether they came in one page (one snapshot), the revision read."""
        found: list[Item] = []
        token = ""
        pages = 0
        while True:
            page = await self._client.list_items(
                self.user_id,
                conversation_id,
                last_n=last_n,
                page_size=PAGE_SIZE,
                page_token=token,
            )
            pages += 1
            found.extend(page.items)
            token = page.next_page_token
            if not token:
                return found, pages == 1, page.revision

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` in one transaction (up to 1000 items). TypeError / ValueError for
        an item that is not JSON (as json.dumps raises them), before anything is stored."""
        if not items:
            return
        # Exactly as SQLiteSession serialises an item (json.dumps, NaN included): the
        # service keeps the text as sent, so get_items returns what SQLiteSession would.
        encoded = [json.dumps(item).encode() for item in items]
        # AppendItems takes up to 1000 items: a larger batch (never one turn's worth) is
        # several transactions, each in order.
        for start in range(0, len(encoded), MAX_ITEMS_PER_CALL):
            await self._append(encoded[start : start + MAX_ITEMS_PER_CALL])

    async def _append(self, encoded: list[bytes]) -> None:
        new_items = [NewItem(text) for text in encoded]
        for attempt in range(2):
            conversation_id = await self.conversation_id()
            assert conversation_id is not None
            try:
                appended = await self._client.append_items(self.user_id, conversation_id, new_items)
            except NotFound:
                # The conversation was deleted meanwhile: the session starts afresh under
                # its key (its old items never come back), as SQLiteSession after a clear.
                self._forget()
                if attempt:
                    raise
                continue
            except PayloadTooLarge as exc:
                raise ValueError(f"item too large for the state service: {exc.message}") from exc
            except InvalidArgument as exc:
                raise ValueError(f"item refused by the state service: {exc.message}") from exc
            cached = self._cached
            if cached is not None and cached.conversation_id == conversation_id:
                # Nothing else changed the items since the kept revision: keep these too.
                # Else the next read reads what came since (these included).
                cached.extend(appended.items, appended.revision, encoded)
            return

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the session is empty."""
        for _ in range(2):
            conversation_id = await self.conversation_id(create=False)
            if conversation_id is None:
                return None
            self._cached = None  # the next read reads everything again
            try:
                popped = await self._client.pop_item(self.user_id, conversation_id)
            except NotFound:
                # Deleted meanwhile; the key may name a newer conversation (see get_items).
                self._forget()
                continue
            return _decode(popped.item) if popped.item is not None else None
        return None

    async def clear_session(self) -> None:
        """Remove the session: its items and its conversation, in one transaction (as
        SQLiteSession deletes its rows and its session row). The next add_items starts
        the session afresh under the same key."""
        conversation_id = await self.conversation_id(create=False)
        self._forget()
        if conversation_id is None:
            return
        with contextlib.suppress(NotFound):  # deleted meanwhile
            await self._client.delete_conversation(self.user_id, conversation_id)


def _decode(item: Item) -> TResponseInputItem:
    return cast("TResponseInputItem", json.loads(item.item_json))


@dataclass
class _Cached:
    """The texts of every item of a conversation up to `revision`, oldest first."""

    conversation_id: str
    revision: int
    items: list[bytes]

    def extend(self, items: list[Item], revision: int, texts: list[bytes] | None = None) -> bool:
        """Take `items` (those after `self.revision`, read or appended at `revision`) when
        they are all that changed since: seqs revision+1.. up to the new revision."""
        if [i.seq for i in items] != list(range(self.revision + 1, revision + 1)):
            return False
        self.items.extend(texts if texts is not None else [i.item_json for i in items])
        self.revision = revision
        return True
