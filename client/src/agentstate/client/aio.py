"""AsyncStateClient: the state service from asyncio code (grpc.aio).

    async with AsyncStateClient.connect("127.0.0.1:50051") as state:
        conversation = await state.create_conversation("alice")

Every call has a deadline (the client's default, or `timeout=` per call), reads are
retried on UNAVAILABLE by the channel's service config, a call refused by a server at
capacity is sent again after the wait the server asks for (agentstate.client.pushback),
and failures raise the typed exceptions of agentstate.client.errors.

StateClient, sync.py, is generated from this file by scripts/async_to_sync.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import grpc

from agentstate.client import convert as ops
from agentstate.client import pushback
from agentstate.client.channel import AsyncChannels
from agentstate.client.convert import Payload
from agentstate.client.errors import NotFound, from_rpc_error
from agentstate.client.settings import DEFAULT_TIMEOUT_SECONDS, ClientSettings
from agentstate.client.types import (
    AcquiredLease,
    AppendedEvent,
    AppendedItems,
    BegunTurn,
    CheckpointPut,
    CheckpointRunLease,
    CheckpointWrite,
    ClearedItems,
    Compaction,
    CompactionNote,
    Conversation,
    ConversationSearch,
    Deleted,
    ErasureReceipt,
    ItemsPage,
    LeaseInfo,
    MessageRecord,
    MessageUpdate,
    MessageWrite,
    NewCheckpoint,
    NewItem,
    NewMessage,
    Page,
    PoppedItem,
    PruneStrategy,
    ResolvedConversation,
    SavedState,
    ScopedStates,
    StateChange,
    StateSnapshot,
    StoredCheckpoint,
    TurnRequest,
)
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from agentstate.client.channel import AsyncInterceptor
    from agentstate.client.tls import ChannelSecurity

R = TypeVar("R")


class AsyncStateClient:
    """Typed calls to every StateService RPC. Built on a channel it borrows (the caller
    closes it), or by connect / from_settings, which open one that close() closes."""

    def __init__(
        self,
        channel: grpc.aio.Channel | AsyncChannels,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        owns_channel: bool = False,
    ) -> None:
        # connect() and from_settings() give AsyncChannels, which open a channel per event
        # loop on first use (asyncio: so that the client works across asyncio.run calls and
        # may be built outside any running loop).
        self._channels = (
            channel if isinstance(channel, AsyncChannels) else AsyncChannels.of(channel)
        )
        self._stub_channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._timeout = timeout_seconds
        self._owns_channel = owns_channel

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        max_message_bytes: int = ClientSettings().max_message_bytes,
        interceptors: Sequence[AsyncInterceptor] | None = None,
        security: ChannelSecurity | None = None,
    ) -> Self:
        """A client on a new channel to `address` ("host:port" or "unix:///path.sock"),
        through `interceptors` when given; TLS, a client certificate and a service token
        as `security` says (agentstate.client.tls; default plaintext)."""
        channels = AsyncChannels(address, max_message_bytes, interceptors, security=security)
        return cls(channels, timeout_seconds=timeout_seconds, owns_channel=True)

    @classmethod
    def from_settings(
        cls, settings: ClientSettings | None = None, security: ChannelSecurity | None = None
    ) -> Self:
        """A client from ClientSettings (default: read from the environment); `security`,
        when given, instead of the one the settings describe."""
        settings = settings if settings is not None else ClientSettings.from_env()
        return cls.connect(
            settings.state_address,
            timeout_seconds=settings.state_timeout_seconds,
            max_message_bytes=settings.max_message_bytes,
            security=security if security is not None else settings.security(),
        )

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channels.current()

    async def close(self) -> None:
        """Close the channel if this client opened it."""
        if self._owns_channel:
            await self._channels.close()
        self._stub_channel = self._stub = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, op: ops.Op[R], timeout: float | None) -> R:
        channel = self._channels.current()
        if channel is not self._stub_channel:
            self._stub_channel, self._stub = channel, pb_grpc.StateServiceStub(channel)
        method = getattr(self._stub, op.method)
        budget = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        while True:
            try:
                response = await method(op.request, timeout=deadline - time.monotonic())
            except grpc.RpcError as exc:
                # A server at capacity refused it before doing anything: come back when
                # it says (agentstate.client.pushback).
                delay = pushback.retry_delay(exc, deadline)
                if delay is None:
                    raise from_rpc_error(exc) from exc
                await pushback.async_pause(delay)
                continue
            return op.parse(response)

    async def find_state(
        self,
        user_id: str,
        conversation_id: str,
        *,
        state_key: str = "",
        timeout: float | None = None,
    ) -> StateSnapshot | None:
        """As get_state, but None when the conversation has no state yet (a missing
        conversation still raises NotFound)."""
        try:
            return await self.get_state(
                user_id, conversation_id, state_key=state_key, timeout=timeout
            )
        except NotFound as exc:
            if exc.missing == "state":
                return None
            raise

    # ---- one method per RPC: each sends the Op that agentstate.client.convert builds ----
    async def get_state(
        self,
        user_id: str,
        conversation_id: str,
        *,
        state_key: str = "",
        timeout: float | None = None,
    ) -> StateSnapshot:
        """The whole stored state and its version. NotFound (missing "conversation" or "state")."""
        return await self._call(ops.get_state(user_id, conversation_id, state_key), timeout)

    async def upsert_state(
        self,
        user_id: str,
        conversation_id: str,
        payload: Payload | None = None,
        *,
        expected_version: int | None = None,
        state_key: str = "",
        writes: Sequence[MessageWrite] = (),
        compactions: Sequence[CompactionNote] = (),
        delta: StateChange | None = None,
        timeout: float | None = None,
    ) -> SavedState:
        """Replace the whole state (bytes or a JSON-able mapping) and apply `writes` in one
        transaction. expected_version: None writes unconditionally, 0 creates only, N writes
        only over version N; else VersionConflict (its current_version is the stored one)."""
        return await self._call(
            ops.upsert_state(
                user_id,
                conversation_id,
                payload,
                expected_version=expected_version,
                state_key=state_key,
                writes=writes,
                compactions=compactions,
                delta=delta,
            ),
            timeout,
        )

    async def create_conversation(
        self,
        user_id: str,
        title: str = "",
        *,
        external_key: str = "",
        labels: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        ttl_renewed_by_writes: bool = False,
        timeout: float | None = None,
    ) -> Conversation:
        """A new conversation; AlreadyExists when `external_key` is another one's. `labels`
        and a time to live (`ttl_seconds`, fixed or renewed by each write) are optional."""
        op = ops.create_conversation(
            user_id, title, external_key, labels, ops.ttl_of(ttl_seconds, ttl_renewed_by_writes)
        )
        return await self._call(op, timeout)

    async def resolve_conversation(
        self,
        user_id: str,
        key: str,
        *,
        create: bool = True,
        title: str = "",
        labels: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        ttl_renewed_by_writes: bool = False,
        timeout: float | None = None,
    ) -> ResolvedConversation:
        """The user's conversation with external key `key`, created when absent and `create`
        (concurrent callers get the same one; `created` is true for one). NotFound when
        absent and not `create`; InvalidArgument for an empty key, over 256 chars or NUL.
        `labels` and the time to live are those of a conversation this call creates."""
        op = ops.resolve_conversation(
            user_id, key, create, title, labels, ops.ttl_of(ttl_seconds, ttl_renewed_by_writes)
        )
        return await self._call(op, timeout)

    async def get_conversation(
        self, user_id: str, conversation_id: str, *, timeout: float | None = None
    ) -> Conversation:
        return await self._call(ops.get_conversation(user_id, conversation_id), timeout)

    async def list_conversations(
        self,
        user_id: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> Page[Conversation]:
        """Newest first; page_size 0 means 50."""
        return await self._call(ops.list_conversations(user_id, page_size, page_token), timeout)

    async def search_conversations(
        self,
        user_id: str = "",
        *,
        page_size: int = 0,
        page_token: str = "",
        key_prefix: str = "",
        label_selector: str = "",
        statuses: Sequence[str] = (),
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        title_prefix: str = "",
        include_total: bool = False,
        all_users: bool = False,
        include_state_key: str = "",
        timeout: float | None = None,
    ) -> ConversationSearch:
        """ListConversations with its filters, newest first. `all_users`: every user's
        (an operator's ability the service must allow; PermissionDenied otherwise)."""
        op = ops.search_conversations(
            user_id,
            page_size=page_size,
            page_token=page_token,
            key_prefix=key_prefix,
            label_selector=label_selector,
            statuses=statuses,
            updated_after=updated_after,
            updated_before=updated_before,
            title_prefix=title_prefix,
            include_total=include_total,
            all_users=all_users,
            include_state_key=include_state_key,
        )
        return await self._call(op, timeout)

    async def update_conversation(
        self,
        user_id: str,
        conversation_id: str,
        *,
        set_labels: Mapping[str, str] | None = None,
        remove_labels: Sequence[str] = (),
        ttl_seconds: int | None = None,
        ttl_renewed_by_writes: bool = False,
        clear_ttl: bool = False,
        timeout: float | None = None,
    ) -> Conversation:
        """Change labels and the time to live (counted from now)."""
        op = ops.update_conversation(
            user_id,
            conversation_id,
            set_labels=set_labels or {},
            remove_labels=remove_labels,
            ttl_seconds=ttl_seconds,
            ttl_renewed_by_writes=ttl_renewed_by_writes,
            clear_ttl=clear_ttl,
        )
        return await self._call(op, timeout)

    async def erase_user(self, user_id: str, *, timeout: float | None = None) -> ErasureReceipt:
        """Remove every row of the user; the receipt (see EraseUser in the contract). It
        takes seconds for thousands of conversations: give a `timeout` to match. A call
        cut short leaves the erase RUNNING; calling again after STATE_ERASE_STALE_SECONDS
        resumes it (before that: ErasureRunning)."""
        return await self._call(ops.erase_user(user_id), timeout)

    async def get_erasure_receipt(
        self, erasure_id: str, *, timeout: float | None = None
    ) -> ErasureReceipt:
        return await self._call(ops.get_erasure_receipt(erasure_id), timeout)

    async def rename_conversation(
        self, user_id: str, conversation_id: str, title: str, *, timeout: float | None = None
    ) -> Conversation:
        return await self._call(ops.rename_conversation(user_id, conversation_id, title), timeout)

    async def delete_conversation(
        self, user_id: str, conversation_id: str, *, timeout: float | None = None
    ) -> Deleted:
        """Delete it with its records, states, lease and compactions in one transaction."""
        return await self._call(ops.delete_conversation(user_id, conversation_id), timeout)

    async def delete_conversations(
        self, user_id: str, conversation_ids: Sequence[str], *, timeout: float | None = None
    ) -> Deleted:
        """Batch delete, all or nothing (NotFound naming an absent id)."""
        return await self._call(ops.delete_conversations(user_id, conversation_ids), timeout)

    async def append_message(
        self,
        user_id: str,
        conversation_id: str,
        record: NewMessage,
        *,
        timeout: float | None = None,
    ) -> MessageRecord:
        return await self._call(ops.append_message(user_id, conversation_id, record), timeout)

    async def update_message(
        self,
        user_id: str,
        conversation_id: str,
        update: MessageUpdate,
        *,
        timeout: float | None = None,
    ) -> MessageRecord:
        """MessageStatusMismatch when `update.expected_status` is set and differs."""
        return await self._call(ops.update_message(user_id, conversation_id, update), timeout)

    async def get_message(
        self, user_id: str, conversation_id: str, message_id: str, *, timeout: float | None = None
    ) -> MessageRecord:
        return await self._call(ops.get_message(user_id, conversation_id, message_id), timeout)

    async def list_messages(
        self,
        user_id: str,
        conversation_id: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        newest_first: bool = False,
        timeout: float | None = None,
    ) -> Page[MessageRecord]:
        """In append order (or newest first); page_size 0 means 100."""
        return await self._call(
            ops.list_messages(user_id, conversation_id, page_size, page_token, newest_first),
            timeout,
        )

    async def list_compactions(
        self, user_id: str, conversation_id: str, *, timeout: float | None = None
    ) -> list[Compaction]:
        """Oldest first."""
        return await self._call(ops.list_compactions(user_id, conversation_id), timeout)

    async def acquire_lease(
        self,
        user_id: str,
        conversation_id: str,
        *,
        holder: str,
        ttl_ms: int,
        max_user_leases: int = 0,
        timeout: float | None = None,
    ) -> AcquiredLease:
        """LeaseHeld when another turn holds it; LimitReached at the per-user limit."""
        return await self._call(
            ops.acquire_lease(user_id, conversation_id, holder, ttl_ms, max_user_leases), timeout
        )

    async def get_lease(
        self, user_id: str, conversation_id: str, *, timeout: float | None = None
    ) -> LeaseInfo | None:
        """The conversation's lease as it is now; None when no turn holds it. A lease
        whose expire_time has passed was never released (its turn died).
        NotFound when the conversation is missing or another user's."""
        return await self._call(ops.get_lease(user_id, conversation_id), timeout)

    async def renew_lease(
        self, user_id: str, task_id: str, ttl_ms: int, *, timeout: float | None = None
    ) -> LeaseInfo:
        """LeaseLost when the lease is gone."""
        return await self._call(ops.renew_lease(user_id, task_id, ttl_ms), timeout)

    async def release_lease(
        self, user_id: str, task_id: str, *, timeout: float | None = None
    ) -> bool:
        """False when it was already gone."""
        return await self._call(ops.release_lease(user_id, task_id), timeout)

    async def request_stop(
        self, user_id: str, task_id: str, *, timeout: float | None = None
    ) -> LeaseInfo:
        return await self._call(ops.request_stop(user_id, task_id), timeout)

    async def begin_turn(self, request: TurnRequest, *, timeout: float | None = None) -> BegunTurn:
        """Start a turn in one transaction: (create the conversation,) take the lease, check
        the card guard, append the records, return the state. CardPending names an open card."""
        return await self._call(ops.begin_turn(request), timeout)

    async def end_turn(
        self,
        user_id: str,
        conversation_id: str,
        task_id: str,
        *,
        payload: Payload | None = None,
        expected_version: int | None = None,
        state_key: str = "",
        writes: Sequence[MessageWrite] = (),
        compactions: Sequence[CompactionNote] = (),
        delta: StateChange | None = None,
        timeout: float | None = None,
    ) -> SavedState:
        """Save the turn (as upsert_state) and release its lease in one transaction; LeaseLost
        when another turn took the lease over. Nothing is saved on any error."""
        return await self._call(
            ops.end_turn(
                user_id,
                conversation_id,
                task_id,
                payload,
                expected_version=expected_version,
                state_key=state_key,
                writes=writes,
                compactions=compactions,
                delta=delta,
            ),
            timeout,
        )

    # ---------------------------------------------------- checkpoints (issue 15)

    async def put_checkpoint(
        self,
        user_id: str,
        conversation_id: str,
        checkpoint: NewCheckpoint,
        *,
        expected_head: str | None = None,
        timeout: float | None = None,
    ) -> datetime:
        """Store a checkpoint and the channel values it introduces in one transaction;
        returns its create time. `expected_head`: None = no check, "" = the namespace holds
        no checkpoint yet, an id = the namespace's newest must be that one, else
        CheckpointConflict (nothing stored). NotFound when the conversation is gone."""
        return await self._call(
            ops.put_checkpoint(user_id, conversation_id, checkpoint, expected_head), timeout
        )

    async def put_checkpoint_step(
        self,
        user_id: str,
        conversation_id: str,
        checkpoint: NewCheckpoint,
        *,
        expected_head: str | None = None,
        parent_writes: Sequence[CheckpointWrite] = (),
        run_lease: CheckpointRunLease | None = None,
        timeout: float | None = None,
    ) -> CheckpointPut:
        """put_checkpoint, in the same transaction storing `parent_writes` (pending writes
        of the parent checkpoint, as put_checkpoint_writes; CheckpointNotStored when the
        parent is not stored) and taking, renewing or releasing the run lease
        (`run_lease`; LeaseHeld, LeaseLost). On any error nothing is stored."""
        return await self._call(
            ops.put_checkpoint_step(
                user_id, conversation_id, checkpoint, expected_head, parent_writes, run_lease
            ),
            timeout,
        )

    async def get_checkpoint(
        self,
        user_id: str,
        conversation_id: str,
        *,
        namespace: str = "",
        checkpoint_id: str = "",
        timeout: float | None = None,
    ) -> StoredCheckpoint | None:
        """The named checkpoint, or the namespace's newest ("" id); None when there is none."""
        return await self._call(
            ops.get_checkpoint(user_id, conversation_id, namespace, checkpoint_id), timeout
        )

    async def list_checkpoints(
        self,
        user_id: str,
        conversation_id: str,
        *,
        namespace: str | None = None,
        metadata_filter: Mapping[str, Any] | None = None,
        before_checkpoint_id: str = "",
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> Page[StoredCheckpoint]:
        """Newest first, with values and pending writes; namespace None = all of them;
        `metadata_filter` keeps those whose metadata contains it; page_size 0 means 20."""
        return await self._call(
            ops.list_checkpoints(
                user_id,
                conversation_id,
                namespace,
                metadata_filter,
                before_checkpoint_id,
                page_size,
                page_token,
            ),
            timeout,
        )

    async def put_checkpoint_writes(
        self,
        user_id: str,
        conversation_id: str,
        *,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        timeout: float | None = None,
    ) -> int:
        """Store a task's pending writes in one transaction (a stored idx >= 0 is kept,
        idx < 0 replaced); returns how many were stored."""
        return await self._call(
            ops.put_checkpoint_writes(user_id, conversation_id, namespace, checkpoint_id, writes),
            timeout,
        )

    async def delete_checkpoints_for_runs(
        self, user_id: str, run_ids: Sequence[str], *, timeout: float | None = None
    ) -> int:
        """Delete the user's checkpoints whose metadata run_id is listed (at most 1000)."""
        return await self._call(ops.delete_checkpoints_for_runs(user_id, run_ids), timeout)

    async def copy_checkpoints(
        self,
        user_id: str,
        source_conversation_id: str,
        target_conversation_id: str,
        *,
        timeout: float | None = None,
    ) -> int:
        """Copy a history into a conversation without checkpoints (else
        TargetHasCheckpoints)."""
        return await self._call(
            ops.copy_checkpoints(user_id, source_conversation_id, target_conversation_id),
            timeout,
        )

    async def prune_checkpoints(
        self,
        user_id: str,
        conversation_ids: Sequence[str],
        strategy: PruneStrategy,
        *,
        timeout: float | None = None,
    ) -> int:
        """Keep each namespace's newest checkpoint (or none), all or nothing."""
        return await self._call(ops.prune_checkpoints(user_id, conversation_ids, strategy), timeout)

    # ---- conversation items and scoped state (agent framework sessions) ----

    async def append_items(
        self,
        user_id: str,
        conversation_id: str,
        items: Sequence[NewItem],
        *,
        expected_revision: int | None = None,
        timeout: float | None = None,
    ) -> AppendedItems:
        """Append items (JSON objects) at the end of the conversation's item list in one
        transaction; concurrent appends all land. expected_revision: None appends
        unconditionally, N only if the item revision is N (else VersionConflict)."""
        return await self._call(
            ops.append_items(user_id, conversation_id, items, expected_revision), timeout
        )

    async def list_items(
        self,
        user_id: str,
        conversation_id: str,
        *,
        last_n: int | None = None,
        min_item_time: datetime | None = None,
        page_size: int = 0,
        page_token: str = "",
        include_state_key: str = "",
        include_scoped_app_name: str = "",
        after_seq: int | None = None,
        timeout: float | None = None,
    ) -> ItemsPage:
        """Items oldest first: all, or the newest `last_n`, optionally only those at or after
        `min_item_time`; page_size 0 means 1000. With `include_state_key` the page also
        carries the conversation's state under that key (`state`), with
        `include_scoped_app_name` that app's scoped states (`scoped`), both read at the
        same point in time as the items. `after_seq`: only items with a larger seq (those
        since revision R are seqs R+1..revision when nothing was popped or cleared)."""
        return await self._call(
            ops.list_items(
                user_id,
                conversation_id,
                last_n=last_n,
                min_item_time=min_item_time,
                page_size=page_size,
                page_token=page_token,
                include_state_key=include_state_key,
                include_scoped_app_name=include_scoped_app_name,
                after_seq=after_seq,
            ),
            timeout,
        )

    async def pop_item(
        self,
        user_id: str,
        conversation_id: str,
        *,
        expected_revision: int | None = None,
        timeout: float | None = None,
    ) -> PoppedItem:
        """Remove and return the newest item (`item` None when the list is empty)."""
        return await self._call(ops.pop_item(user_id, conversation_id, expected_revision), timeout)

    async def clear_items(
        self, user_id: str, conversation_id: str, *, timeout: float | None = None
    ) -> ClearedItems:
        """Remove all the conversation's items (the conversation and its state stay)."""
        return await self._call(ops.clear_items(user_id, conversation_id), timeout)

    async def get_scoped_state(
        self, user_id: str, app_name: str, *, timeout: float | None = None
    ) -> ScopedStates:
        """The app-scoped state of `app_name` and the user's state in it (None: unwritten)."""
        return await self._call(ops.get_scoped_state(user_id, app_name), timeout)

    async def append_event(
        self,
        user_id: str,
        conversation_id: str,
        *,
        item: NewItem | None = None,
        expected_revision: int | None = None,
        state_key: str = "",
        state_delta: Payload | None = None,
        app_name: str = "",
        app_state_delta: Payload | None = None,
        user_state_delta: Payload | None = None,
        timeout: float | None = None,
    ) -> AppendedEvent:
        """In one transaction: check expected_revision (VersionConflict), append `item`,
        merge `state_delta` into the conversation state under `state_key` and the app and
        user deltas into `app_name`'s scoped state. `state_delta`'s "temp:" keys are
        never stored."""
        return await self._call(
            ops.append_event(
                user_id,
                conversation_id,
                item=item,
                expected_revision=expected_revision,
                state_key=state_key,
                state_delta=state_delta,
                app_name=app_name,
                app_state_delta=app_state_delta,
                user_state_delta=user_state_delta,
            ),
            timeout,
        )
