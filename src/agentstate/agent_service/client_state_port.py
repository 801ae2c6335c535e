"""The runtime's StatePort (agent_service/runtime/port.py) over agentstate.client.

A thin adapter: the public AsyncStateClient speaks the contract; this decodes the
AgentState, records the runtime's spans and metrics, and turns the client's exceptions
into the runtime's errors (agent_service.errors), keeping the client error as the cause
so the agent's own statuses carry the state service's ErrorInfo through.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar, overload

import grpc

from agentstate.agent_service import errors
from agentstate.agent_service.agent_state import AgentState
from agentstate.agent_service.records import EndedTurn, LoadedState, LoadedTurn
from agentstate.client import (
    AsyncStateClient,
    CardAlreadyHandled,
    CardPending,
    ConversationSearch,
    NotFound,
    StateError,
)
from agentstate.client.types import (
    CompactionNote,
    Conversation,
    Deleted,
    LeaseInfo,
    MessageRecord,
    MessageUpdate,
    MessageWrite,
    NewMessage,
    Page,
    StateChange,
    TurnRequest,
)
from agentstate.common.state_metrics import (
    LOAD_DURATION,
    PAYLOAD_SIZE,
    SAVE_DURATION,
    VERSION_CONFLICTS,
)
from agentstate.common.telemetry import tracer

P = ParamSpec("P")
R = TypeVar("R")

_ERRORS: dict[grpc.StatusCode, type[errors.AgentError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidInput,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.Conflict,
    grpc.StatusCode.ABORTED: errors.StateVersionConflict,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.LimitReached,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Unavailable,
}


def agent_error(exc: StateError) -> errors.AgentError:
    """The runtime's error for a failed state call (by status code, as before the client)."""
    kind = _ERRORS.get(exc.code, errors.InternalError)
    detail = exc.message or exc.code.name
    if kind is errors.Unavailable:
        # gRPC's words name addresses ("ipv4:10.1.2.3:50051: connect failed"), the
        # database's its host: for operators (ErrorInfo, logs), not for the message.
        return errors.Unavailable("state service unavailable; retry", metadata={"detail": detail})
    if isinstance(exc, CardPending) and exc.awaiting_message_id:
        return errors.CardPending(detail, exc.awaiting_message_id)
    if isinstance(exc, CardAlreadyHandled):
        return errors.CardAlreadyHandled(detail)
    return kind(detail)


def _translated(call: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    @functools.wraps(call)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await call(*args, **kwargs)
        except StateError as exc:
            raise agent_error(exc) from exc

    return wrapper


def record_text(value: Any) -> Any:
    """A message record's JSON with each U+0000 as U+FFFD. The records are the UI's
    replay of what the user saw, stored where U+0000 cannot be; the agent state (the
    model's context) keeps the exact text, so a tool output with NUL never fails a turn."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [record_text(item) for item in value]
    if isinstance(value, dict):
        return {record_text(k): record_text(v) for k, v in value.items()}
    return value


@overload
def record_write(write: NewMessage) -> NewMessage: ...
@overload
def record_write(write: MessageUpdate) -> MessageUpdate: ...
def record_write(write: MessageWrite) -> MessageWrite:
    """`write` with record_text applied to its blocks and metadata."""
    if isinstance(write, NewMessage):
        return dataclasses.replace(
            write, blocks=record_text(write.blocks), metadata=record_text(write.metadata)
        )
    return dataclasses.replace(
        write,
        blocks=None if write.blocks is None else record_text(write.blocks),
        metadata=None if write.metadata is None else record_text(write.metadata),
    )


def _decode_state(payload: bytes, conversation_id: str) -> AgentState:
    try:
        return AgentState.decode(payload)
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.InternalError(
            f"stored state of conversation {conversation_id} cannot be decoded: {exc}"
        ) from exc


class ClientStatePort:
    """The agent's StatePort, plus the conversation and record reads the agent's own API
    passes through, over an AsyncStateClient."""

    def __init__(self, client: AsyncStateClient) -> None:
        self.client = client

    @classmethod
    def on_channel(
        cls, channel: grpc.aio.Channel, *, timeout_seconds: float = 10.0
    ) -> ClientStatePort:
        return cls(AsyncStateClient(channel, timeout_seconds=timeout_seconds))

    # -------------------------------------------------------- conversations

    @_translated
    async def list_conversations(
        self, user_id: str, page_size: int, page_token: str
    ) -> Page[Conversation]:
        return await self.client.list_conversations(
            user_id, page_size=page_size, page_token=page_token
        )

    @_translated
    async def search_conversations(
        self,
        user_id: str,
        page_size: int,
        page_token: str,
        *,
        title_prefix: str = "",
        statuses: Sequence[str] = (),
        label_selector: str = "",
    ) -> ConversationSearch:
        """The user's conversations filtered on the state service (issue 23)."""
        return await self.client.search_conversations(
            user_id,
            page_size=page_size,
            page_token=page_token,
            title_prefix=title_prefix,
            statuses=statuses,
            label_selector=label_selector,
        )

    @_translated
    async def rename_conversation(
        self, user_id: str, conversation_id: str, title: str
    ) -> Conversation:
        return await self.client.rename_conversation(user_id, conversation_id, title)

    @_translated
    async def delete_conversations(self, user_id: str, conversation_ids: Sequence[str]) -> Deleted:
        return await self.client.delete_conversations(user_id, conversation_ids)

    # ---------------------------------------------------------------- state

    @_translated
    async def load(self, user_id: str, conversation_id: str) -> LoadedState:
        """The stored state and its version. Any failure raises: a turn never
        starts from a fresh state because a load failed."""
        with tracer().start_as_current_span("state.load") as span:
            span.set_attribute("agentstate.conversation_id", conversation_id)
            started = time.perf_counter()
            outcome = "error"
            try:
                try:
                    snapshot = await self.client.get_state(user_id, conversation_id)
                except NotFound as exc:
                    if exc.missing == "state":
                        outcome = "not_found"
                        span.set_attribute("agentstate.state.version_read", 0)
                        return LoadedState(None, 0)
                    raise
                state = _decode_state(snapshot.payload, conversation_id)
                outcome = "ok"
                size = len(snapshot.payload)
                span.set_attributes(
                    {
                        "agentstate.state.payload_bytes": size,
                        "agentstate.state.message_count": len(state.context),
                        "agentstate.state.version_read": snapshot.version,
                    }
                )
                PAYLOAD_SIZE.record(size, {"side": "client", "op": "load"})
                return LoadedState(state, snapshot.version)
            finally:
                span.set_attribute("agentstate.state.outcome", outcome)
                LOAD_DURATION.record(
                    time.perf_counter() - started, {"side": "client", "outcome": outcome}
                )

    # ---------------------------------------------------------------- turns

    @_translated
    async def begin_turn(self, request: TurnRequest) -> LoadedTurn:
        """Start a turn in one call: (create the conversation,) take the lease, check the
        card guard, append the turn's records, load the state. Any failure raises and
        changes nothing: a turn never starts from a fresh state because a load failed."""
        with tracer().start_as_current_span("state.load") as span:
            span.set_attribute("agentstate.state.rpc", "BeginTurn")
            if request.conversation_id:
                span.set_attribute("agentstate.conversation_id", request.conversation_id)
            started = time.perf_counter()
            outcome = "error"
            try:
                begun = await self.client.begin_turn(
                    dataclasses.replace(
                        request,
                        new_records=tuple(record_write(r) for r in request.new_records),
                    )
                )
                conversation_id = begun.conversation_id
                state = None
                if begun.state is not None and not begun.payload_omitted:
                    state = _decode_state(begun.state.payload, conversation_id)
                    size = len(begun.state.payload)
                    span.set_attributes(
                        {
                            "agentstate.state.payload_bytes": size,
                            "agentstate.state.message_count": len(state.context),
                        }
                    )
                    PAYLOAD_SIZE.record(size, {"side": "client", "op": "load"})
                if begun.payload_omitted:  # the caller holds this version already
                    span.set_attributes(
                        {
                            "agentstate.state.payload_omitted": True,
                            "agentstate.state.payload_bytes": 0,
                        }
                    )
                outcome = "ok" if begun.version else "not_found"
                span.set_attributes(
                    {
                        "agentstate.conversation_id": conversation_id,
                        "agentstate.state.version_read": begun.version,
                    }
                )
                return LoadedTurn(
                    conversation_id=conversation_id,
                    conversation_created=begun.conversation_created,
                    task_id=begun.task_id,
                    lapsed_task_id=begun.lapsed_task_id,
                    interrupted_records=begun.interrupted_records,
                    state=state,
                    version=begun.version,
                    record_ids=[r.message_id for r in begun.records],
                    payload_omitted=begun.payload_omitted,
                )
            finally:
                span.set_attribute("agentstate.state.outcome", outcome)
                LOAD_DURATION.record(
                    time.perf_counter() - started, {"side": "client", "outcome": outcome}
                )

    @_translated
    async def end_turn(
        self,
        user_id: str,
        conversation_id: str,
        task_id: str,
        *,
        payload: bytes | None,
        message_count: int,
        expected_version: int,
        writes: Sequence[MessageWrite] = (),
        compactions: Sequence[CompactionNote] = (),
        change: StateChange | None = None,
    ) -> EndedTurn:
        """Save the turn in one call: the whole state (compare-and-set on the loaded
        version) or what changed since that version (`change`), its record writes and
        compaction notes, and release the lease. On any error nothing is saved and the
        lease is kept."""
        sent = len(payload or b"") if change is None else change.size
        with tracer().start_as_current_span("state.save") as span:
            span.set_attributes(
                {
                    "agentstate.state.rpc": "EndTurn",
                    "agentstate.conversation_id": conversation_id,
                    "agentstate.state.payload_bytes": sent,
                    "agentstate.state.delta": change is not None,
                    "agentstate.state.message_count": message_count,
                    "agentstate.state.version_read": expected_version,
                    "agentstate.state.message_writes": len(writes),
                }
            )
            PAYLOAD_SIZE.record(sent, {"side": "client", "op": "save"})
            started = time.perf_counter()
            outcome = "error"
            try:
                saved = await self.client.end_turn(
                    user_id,
                    conversation_id,
                    task_id,
                    payload=payload if change is None else None,
                    expected_version=expected_version if change is None else None,
                    writes=[record_write(w) for w in writes],
                    compactions=compactions,
                    delta=change,
                )
                outcome = "ok"
                span.set_attribute("agentstate.state.version_written", saved.version)
                return EndedTurn(saved.version, saved.lease_released)
            except StateError as exc:
                if exc.code == grpc.StatusCode.ABORTED:
                    outcome = "version_conflict"
                    VERSION_CONFLICTS.add(1, {"side": "client"})
                raise
            finally:
                span.set_attribute("agentstate.state.outcome", outcome)
                SAVE_DURATION.record(
                    time.perf_counter() - started, {"side": "client", "outcome": outcome}
                )

    # ------------------------------------------------------------- messages

    @_translated
    async def update_message(
        self, user_id: str, conversation_id: str, update: MessageUpdate
    ) -> None:
        await self.client.update_message(user_id, conversation_id, record_write(update))

    @_translated
    async def get_message(
        self, user_id: str, conversation_id: str, message_id: str
    ) -> MessageRecord:
        return await self.client.get_message(user_id, conversation_id, message_id)

    @_translated
    async def list_messages(
        self,
        user_id: str,
        conversation_id: str,
        page_size: int,
        page_token: str,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        return await self.client.list_messages(
            user_id,
            conversation_id,
            page_size=page_size,
            page_token=page_token,
            newest_first=newest_first,
        )

    # --------------------------------------------------------------- leases

    @_translated
    async def renew_lease(self, user_id: str, task_id: str, ttl_ms: int) -> LeaseInfo:
        return await self.client.renew_lease(user_id, task_id, ttl_ms)

    @_translated
    async def release_lease(self, user_id: str, task_id: str) -> bool:
        return await self.client.release_lease(user_id, task_id)

    @_translated
    async def request_stop(self, user_id: str, task_id: str) -> LeaseInfo:
        return await self.client.request_stop(user_id, task_id)
