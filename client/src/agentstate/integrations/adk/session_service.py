"""A Google ADK `BaseSessionService` kept in the state service.

    state = AsyncStateClient.connect("127.0.0.1:50051")
    runner = Runner(agent=agent, app_name="shop", session_service=AgentStateSessionService(state))

An ADK session is a conversation of ADK's `user_id`, found by the external key
"adk:<app_name>:<session_id>". Its events are the conversation's items; its session-scoped
state is the conversation's state under the key "adk.session"; `app:` and `user:` state are
the service's app- and user-scoped state of `app_name`. `temp:` state lives only in the
session object of the running invocation and is never stored.

`append_event` is ONE AppendEvent call, so the event, the session state, `app:` and `user:`
state change together or not at all, and it is compare-and-set on the session's revision:
a caller whose session object is older than the stored session gets ADK's
StaleSessionError and nothing is written. Deleting a session deletes the conversation with
its events and state in one transaction; a late append is SessionNotFoundError.

A session's time to live: `ttl_seconds=` on the service (every session it creates), or per
session as VertexAiSessionService takes it, `create_session(..., ttl="7200s")` (a duration
string, an int of seconds or a timedelta) or `expire_time=` (a datetime or an RFC 3339
string; a fixed time to live until then). `ttl_renewed_by_writes=True` (on the service or
per session) renews it by each appended event instead of counting from creation. The
state service's retention sweep deletes an expired session (a running turn spared):
get_session then returns None.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from google.adk.errors._stale_session_error import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from agentstate.client.aio import AsyncStateClient
from agentstate.client.errors import (
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    VersionConflict,
)
from agentstate.client.settings import ClientSettings
from agentstate.client.tls import ChannelSecurity
from agentstate.client.types import (
    Conversation,
    Item,
    ItemsPage,
    NewItem,
    ScopedStates,
    StateSnapshot,
)
from agentstate.integrations._connection import BoundedCache, Connection
from agentstate.integrations._ttl import TimeToLive, time_to_live

KEY_PREFIX = "adk:"
SESSION_STATE_KEY = "adk.session"  # the conversation state holding session-scoped state
PAGE_SIZE = 1000  # items per ListItems page (a page must fit one gRPC message)
MAX_KEY_CHARS = 256
MAX_CACHED_IDS = 10_000
MAX_KNOWN_SESSIONS = 256  # sessions whose parsed events are kept (least recently read go)
MAX_KNOWN_EVENTS = 1000  # a longer session is read whole each time, not kept
STALE_SESSION_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)


def session_key(app_name: str, session_id: str) -> str:
    """The conversation external key of an ADK session."""
    return f"{KEY_PREFIX}{app_name}:{session_id}"


def _check_names(app_name: str, user_id: str) -> None:
    # ADK's own services take any string; ours keys by them, so an empty one is refused
    # here, by ADK's convention for bad arguments (ValueError), not as a gRPC status.
    if not app_name or not isinstance(app_name, str):
        raise ValueError("app_name must be a non-empty string")
    if not user_id or not isinstance(user_id, str):
        raise ValueError("user_id must be a non-empty string")


class AgentStateSessionService(BaseSessionService):
    """ADK sessions in the state service (see the module docstring)."""

    def __init__(
        self,
        target: AsyncStateClient | str | ClientSettings | None = None,
        *,
        address: str | None = None,
        client: AsyncStateClient | None = None,
        settings: ClientSettings | None = None,
        security: ChannelSecurity | None = None,
        ttl_seconds: int | None = None,
        ttl_renewed_by_writes: bool = False,
    ) -> None:
        """One of: an AsyncStateClient (yours to close), an address or ClientSettings (a
        connection this service opens and `close()` closes), positionally or by name;
        `security`: TLS for that connection (agentstate.client.tls). `ttl_seconds`: the
        default time to live of the sessions this service creates (None: none), renewed
        by each event with `ttl_renewed_by_writes`; ValueError when not a positive int."""
        self.ttl = time_to_live(ttl_seconds, ttl_renewed_by_writes)
        self._connection = Connection(
            target,
            address=address,
            client=client,
            settings=settings,
            security=security,
            who="AgentStateSessionService",
        )
        # (app, user, session id) -> conversation id, so that an event is one call. Ids are
        # never reused: a deleted session's entry only ever leads to NOT_FOUND.
        self._ids: BoundedCache[tuple[str, str, str], str] = BoundedCache(MAX_CACHED_IDS)
        # conversation id -> its events as parsed (pydantic's parse is most of a read):
        # a session read again reads only the events since (see _KnownEvents).
        self._known: BoundedCache[str, _KnownEvents] = BoundedCache(MAX_KNOWN_SESSIONS)

    @property
    def _client(self) -> AsyncStateClient:
        return self._connection.aclient()

    async def close(self) -> None:
        """Close the connection this service opened (not a client it was given), as
        DatabaseSessionService.close."""
        await self._connection.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._connection.close()

    # ------------------------------------------------------------ lookups

    async def _conversation(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        *,
        create: bool,
        ttl: TimeToLive | None = None,
    ) -> tuple[Conversation, bool] | None:
        """The session's conversation and whether this call created it; None when absent."""
        _check_names(app_name, user_id)
        key = session_key(app_name, session_id)
        if not session_id or len(key) > MAX_KEY_CHARS or "\x00" in key:
            raise ValueError(
                f"session id {session_id[:40]!r} is not usable: 1..{MAX_KEY_CHARS} characters "
                "with the app name, without NUL"
            )
        try:
            resolved = await self._client.resolve_conversation(
                user_id,
                key,
                create=create,
                title=session_id[:200],
                ttl_seconds=ttl.seconds if ttl else None,
                ttl_renewed_by_writes=ttl.renewed_by_writes if ttl else False,
            )
        except NotFound:
            return None
        except InvalidArgument as exc:
            raise ValueError(exc.message) from exc
        self._ids[(app_name, user_id, session_id)] = resolved.conversation.conversation_id
        return resolved.conversation, resolved.created

    async def _scoped(self, app_name: str, user_id: str) -> dict[str, Any]:
        """app: and user: state with their prefixes, to merge into a session's state."""
        return _scoped_state(await self._client.get_scoped_state(user_id, app_name))

    # ------------------------------------------------------------- the API

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> Session:
        """As BaseSessionService.create_session; `ttl`, `expire_time` and
        `ttl_renewed_by_writes` set this session's time to live (see the module
        docstring), ValueError for a bad one and TypeError for another keyword."""
        ttl = self._session_ttl(kwargs)
        session_id = session_id.strip() if session_id else None
        session_id = session_id or str(uuid.uuid4())
        found = await self._conversation(app_name, user_id, session_id, create=True, ttl=ttl)
        assert found is not None
        conversation, created = found
        if not created:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        # As ADK's persistent services: values that are not JSON become their string form
        # (with a warning); temp: keys are dropped.
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        revision = 0
        if any(deltas.values()):
            try:
                appended = await self._client.append_event(
                    user_id,
                    conversation.conversation_id,
                    expected_revision=0,
                    state_key=SESSION_STATE_KEY,
                    state_delta=_delta_json(deltas["session"]),
                    app_name=app_name,
                    app_state_delta=_delta_json(deltas["app"]),
                    user_state_delta=_delta_json(deltas["user"]),
                )
            except (InvalidArgument, PayloadTooLarge) as exc:
                # Nothing of the session may stay behind a refused create.
                await self._client.delete_conversation(user_id, conversation.conversation_id)
                raise ValueError(f"session state refused: {exc.message}") from exc
            revision = appended.revision
        # Session keys first, then app: and user: ones, as InMemorySessionService orders them.
        merged = {**deltas["session"], **await self._scoped(app_name, user_id)}
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=merged,
            events=[],
            last_update_time=conversation.create_time.timestamp(),
        )
        session._storage_update_marker = str(revision)
        return session

    def _session_ttl(self, options: dict[str, Any]) -> TimeToLive | None:
        unknown = set(options) - {"ttl", "expire_time", "ttl_renewed_by_writes"}
        if unknown:
            raise TypeError(f"create_session got unexpected keyword arguments {sorted(unknown)}")
        ttl, expire_time = options.get("ttl"), options.get("expire_time")
        renewed = options.get(
            "ttl_renewed_by_writes", self.ttl.renewed_by_writes if self.ttl else False
        )
        if ttl is not None and expire_time is not None:
            # VertexAiSessionService's own check, in its words.
            raise ValueError("Cannot specify both 'ttl' and 'expire_time' simultaneously.")
        if expire_time is not None:
            if options.get("ttl_renewed_by_writes"):
                raise ValueError("expire_time is a fixed expiry: not with ttl_renewed_by_writes")
            return time_to_live(_seconds_until(expire_time), what="expire_time (from now)")
        if ttl is not None:
            return time_to_live(_duration_seconds(ttl), renewed, what="ttl")
        if self.ttl is None:
            return time_to_live(None, renewed)
        return time_to_live(self.ttl.seconds, renewed)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        if not session_id:
            _check_names(app_name, user_id)
            return None  # as InMemorySessionService: no session has an empty id
        config = config or GetSessionConfig()
        # One ListItems call: the events, the session state and the app: and user: state,
        # read at one point in time, so the session is exactly the one its marker (the
        # revision) names.
        # A known conversation id skips the lookup; ids are never reused, so a stale one
        # only ever leads to NOT_FOUND, and then to one lookup by key.
        ids_key = (app_name, user_id, session_id)
        loaded = None
        conversation_id = self._ids.get(ids_key)
        if conversation_id is not None:
            try:
                loaded = await self._events(user_id, conversation_id, config, app_name=app_name)
            except NotFound:
                self._ids.pop(ids_key, None)
                self._known.pop(conversation_id)
        if loaded is None:
            found = await self._conversation(app_name, user_id, session_id, create=False)
            if found is None:
                return None
            try:
                loaded = await self._events(
                    user_id, found[0].conversation_id, config, app_name=app_name
                )
            except NotFound:
                self._ids.pop(ids_key, None)
                return None  # deleted meanwhile
        events, page = loaded
        # Session keys first, then app: and user: ones, as InMemorySessionService orders them.
        merged = {**_object(page.state), **_scoped_state(page.scoped)}
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=merged,
            events=events,
            last_update_time=page.update_time.timestamp(),
        )
        session._storage_update_marker = str(page.revision)
        return session

    async def _events(
        self, user_id: str, conversation_id: str, config: GetSessionConfig, *, app_name: str = ""
    ) -> tuple[list[Event], ItemsPage]:
        """The events as InMemorySessionService selects them: the newest
        `num_recent_events` (none for 0), then, with `after_timestamp`, those after the
        newest event older than it (a suffix, so an event appended out of order ends
        it), events at exactly `after_timestamp` included. With `app_name`, the last page
        also carries the session state and that app's scoped states."""
        state_key = SESSION_STATE_KEY if app_name else ""
        if config.num_recent_events == 0:
            page = await self._client.list_items(
                user_id,
                conversation_id,
                last_n=0,
                page_size=1,
                include_state_key=state_key,
                include_scoped_app_name=app_name,
            )
            return [], page
        known = self._known.get(conversation_id)
        if known is not None:
            # Only what came since the kept revision; kept when it is all that changed.
            page = await self._client.list_items(
                user_id,
                conversation_id,
                page_size=PAGE_SIZE,
                after_seq=known.revision,
                include_state_key=state_key,
                include_scoped_app_name=app_name,
            )
            if not page.next_page_token and known.extend(page.items, page.revision):
                # Copies: the caller may change its session's events, never the kept ones.
                events = [e.model_copy(deep=True) for e in known.events]
                if config.num_recent_events is not None:
                    events = events[-config.num_recent_events :]
                return _after_timestamp(events, config), page
            self._known.pop(conversation_id)
        events, page, single_page = await self._read_events(
            user_id, conversation_id, config.num_recent_events, state_key, app_name
        )
        if config.num_recent_events is None and single_page and len(events) <= MAX_KNOWN_EVENTS:
            self._known[conversation_id] = _KnownEvents(
                page.revision, [e.model_copy(deep=True) for e in events]
            )
        return _after_timestamp(events, config), page

    async def _read_events(
        self,
        user_id: str,
        conversation_id: str,
        last_n: int | None,
        state_key: str,
        app_name: str,
    ) -> tuple[list[Event], ItemsPage, bool]:
        """The newest `last_n` events (all: None), the last page, whether it was the only."""
        events: list[Event] = []
        token = ""
        pages = 0
        while True:
            page = await self._client.list_items(
                user_id,
                conversation_id,
                last_n=last_n,
                page_size=PAGE_SIZE,
                page_token=token,
                include_state_key=state_key,
                include_scoped_app_name=app_name,
            )
            pages += 1
            events.extend(Event.model_validate_json(item.item_json) for item in page.items)
            token = page.next_page_token
            if not token:
                return events, page, pages == 1

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions of `app_name`, least recently updated first, without events: one
        ListConversations call per page (filtered by the app's key namespace on the
        server, each session's state in the same answer), plus one GetScopedState per
        user listed. `user_id` None lists every user's sessions: an operator's ability
        the state service must allow (STATE_ALLOW_LIST_ALL_USERS), else PermissionError."""
        if user_id is None:
            if not app_name or not isinstance(app_name, str):
                raise ValueError("app_name must be a non-empty string")
        else:
            _check_names(app_name, user_id)
        prefix = session_key(app_name, "")
        scoped: dict[str, dict[str, Any]] = {}
        sessions: list[Session] = []
        token = ""
        while True:
            try:
                page = await self._client.search_conversations(
                    user_id or "",
                    all_users=user_id is None,
                    key_prefix=prefix,
                    include_state_key=SESSION_STATE_KEY,
                    page_size=500,
                    page_token=token,
                )
            except PermissionDenied as exc:
                raise PermissionError(exc.message) from exc
            for conversation in page.items:
                owner = conversation.user_id
                if owner not in scoped:
                    scoped[owner] = await self._scoped(app_name, owner)
                stored = page.states.get(conversation.conversation_id)
                session_state = json.loads(stored) if stored is not None else {}
                sessions.append(
                    Session(
                        app_name=app_name,
                        user_id=owner,
                        id=conversation.external_key.removeprefix(prefix),
                        state={**session_state, **scoped[owner]},
                        events=[],
                        last_update_time=conversation.update_time.timestamp(),
                    )
                )
            token = page.next_page_token
            if not token:
                break
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session's conversation, events and state in one transaction; a
        session that does not exist is not an error (as ADK's own services)."""
        session_id = session_id.strip() if session_id else session_id
        if not session_id:
            _check_names(app_name, user_id)
            return  # no session has an empty id
        found = await self._conversation(app_name, user_id, session_id, create=False)
        self._ids.pop((app_name, user_id, session_id), None)
        if found is None:
            return
        self._known.pop(found[0].conversation_id)
        with contextlib.suppress(NotFound):  # deleted meanwhile
            await self._client.delete_conversation(user_id, found[0].conversation_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        _check_names(app_name, user_id)
        scoped = await self._client.get_scoped_state(user_id, app_name)
        return _object(scoped.user)

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        conversation_id = self._ids.get((session.app_name, session.user_id, session.id))
        if conversation_id is None:
            found = await self._conversation(
                session.app_name, session.user_id, session.id, create=False
            )
            if found is None:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            conversation_id = found[0].conversation_id
        # As InMemorySessionService: re-delivering an event equal to one already stored
        # (the same id and fields) changes nothing, so a retried call is harmless; to a
        # deleted session it is SessionNotFoundError, as any append (one cheap read).
        if _holds(session.events, event):
            try:
                await self._client.list_items(
                    session.user_id, conversation_id, last_n=0, page_size=1
                )
            except NotFound as exc:
                self._ids.pop((session.app_name, session.user_id, session.id), None)
                raise SessionNotFoundError(f"Session {session.id} not found.") from exc
            return event
        # As the base class: temp: state reaches this invocation's session object only
        # (and is never stored). Applied once the event is stored: a refused append (a
        # deleted or stale session) leaves the session object and the event as they were.
        stored_event = self._trim_temp_delta_state(event.model_copy(deep=True))
        deltas = _session_util.extract_json_safe_state_delta(stored_event.actions.state_delta or {})
        marker = session._storage_update_marker
        try:
            appended = await self._client.append_event(
                session.user_id,
                conversation_id,
                item=NewItem(
                    stored_event.model_dump_json(exclude_none=True).encode(),
                    item_time=datetime.fromtimestamp(event.timestamp, UTC),
                ),
                expected_revision=int(marker) if marker is not None else None,
                state_key=SESSION_STATE_KEY,
                state_delta=_delta_json(deltas["session"]),
                app_name=session.app_name,
                app_state_delta=_delta_json(deltas["app"]),
                user_state_delta=_delta_json(deltas["user"]),
            )
        except VersionConflict as exc:
            # A retry of an append that was stored (its answer was lost): idempotent.
            if await self._stored(session, conversation_id, event):
                return event
            raise StaleSessionError(STALE_SESSION_MESSAGE) from exc
        except NotFound as exc:
            self._ids.pop((session.app_name, session.user_id, session.id), None)
            raise SessionNotFoundError(f"Session {session.id} not found.") from exc
        except (InvalidArgument, PayloadTooLarge) as exc:
            raise ValueError(f"event refused by the state service: {exc.message}") from exc
        session._storage_update_marker = str(appended.revision)
        session.last_update_time = event.timestamp
        self._apply_temp_state(session, event)
        return self._commit_event_to_session(session, self._trim_temp_delta_state(event))

    async def _stored(self, session: Session, conversation_id: str, event: Event) -> bool:
        """Whether an event equal to `event` is stored in the session."""
        try:
            stored, _ = await self._events(session.user_id, conversation_id, GetSessionConfig())
        except NotFound:
            return False
        return _holds(stored, event)


@dataclass
class _KnownEvents:
    """Every event of a session up to item revision `revision`, oldest first, parsed.

    A session's events are never rewritten; AppendEvent gives its item the revision it
    makes as its seq. So when the items after `revision` are exactly seqs revision+1 up
    to the new revision, nothing was deleted meanwhile (a pop, a clear or a state-only
    append makes a revision no item has) and these events plus the new ones are the
    session's events at the new revision. Otherwise the session is read again."""

    revision: int
    events: list[Event]

    def extend(self, items: list[Item], revision: int) -> bool:
        if [i.seq for i in items] != list(range(self.revision + 1, revision + 1)):
            return False
        if len(self.events) + len(items) > MAX_KNOWN_EVENTS:
            return False  # memory stays bounded: read whole from now on
        self.events.extend(Event.model_validate_json(i.item_json) for i in items)
        self.revision = revision
        return True


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)s")


def _duration_seconds(ttl: object) -> object:
    """Seconds of a time to live given as Vertex AI takes it ("7200s", a protobuf Duration
    in JSON), or as an int or a timedelta; whole seconds, rounded up. Anything else is
    returned as it is, for time_to_live to refuse."""
    if isinstance(ttl, timedelta):
        return math.ceil(ttl.total_seconds())
    if isinstance(ttl, str):
        matched = _DURATION.fullmatch(ttl.strip())
        if matched is None:
            raise ValueError(f'ttl must be a duration like "7200s", got {ttl!r}')
        return math.ceil(float(matched.group(1)))
    return ttl


def _seconds_until(expire_time: object) -> int:
    if isinstance(expire_time, str):
        try:
            expire_time = datetime.fromisoformat(expire_time.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError(f"expire_time must be an RFC 3339 time, got {expire_time!r}") from exc
    if not isinstance(expire_time, datetime) or expire_time.tzinfo is None:
        raise ValueError(f"expire_time must be a datetime with a time zone, got {expire_time!r}")
    return math.ceil((expire_time - datetime.now(UTC)).total_seconds())


def _after_timestamp(events: list[Event], config: GetSessionConfig) -> list[Event]:
    """With `after_timestamp`, the events after the newest one older than it (a suffix, as
    InMemorySessionService: an event appended out of order ends it)."""
    if config.after_timestamp is None:
        return events
    start = len(events)
    while start > 0 and events[start - 1].timestamp >= config.after_timestamp:
        start -= 1
    return events[start:]


def _holds(events: list[Event], event: Event) -> bool:
    return any(e == event for e in events if e.id == event.id)


def _delta_json(delta: dict[str, Any]) -> bytes | None:
    """A state delta as DatabaseSessionService's JSON column writes it (json.dumps, NaN
    included); the service keeps each value's text as sent."""
    return json.dumps(delta).encode() if delta else None


def _scoped_state(scoped: ScopedStates | None) -> dict[str, Any]:
    """app: and user: state with their prefixes, to merge into a session's state."""
    if scoped is None:
        return {}
    merged = {State.APP_PREFIX + k: v for k, v in _object(scoped.app).items()}
    merged.update({State.USER_PREFIX + k: v for k, v in _object(scoped.user).items()})
    return merged


def _object(snapshot: StateSnapshot | None) -> dict[str, Any]:
    if snapshot is None:
        return {}
    value = json.loads(snapshot.payload)
    assert isinstance(value, dict)
    return value
