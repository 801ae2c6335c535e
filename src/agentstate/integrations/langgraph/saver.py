"""LangGraph's checkpointer on the state service.

`AgentStateSaver` is a `BaseCheckpointSaver` whose every method is one or two calls of the
state service's checkpoint RPCs (through `agentstate.client`): a LangGraph thread is a
conversation of the saver's user, found by the thread id as the conversation's external
key; checkpoints, their channel values and pending writes are that conversation's agent
state, deleted with it in one transaction.

What it adds to LangGraph's own savers:
- A history never forks by accident: a put names the head it extends (its parent, or
  "none yet" for a thread's first checkpoint) and the service refuses it, in the same
  transaction, when another writer got there first (`CheckpointConflict`). Branches a
  caller makes on purpose (time travel: metadata source "fork" or "update") are not checked.
- `put_writes` is idempotent per (checkpoint, task, idx) and atomic per call.
- `delete_thread` deletes the conversation and everything of it in one transaction; a
  write that arrives later from a run that was using the thread is refused, never
  resurrecting it (`ThreadDeleted`).
- `delete_for_runs`, `copy_thread` and `prune` are implemented, each one transaction.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentstate.integrations.langgraph import _shim as client
from agentstate.state.v1 import state_service_pb2 as pb

DEFAULT_USER_ID = "langgraph"
# A channel whose version changed but that holds no value (LangGraph's savers store the
# same marker).
_EMPTY = "empty"
_PRUNE_STRATEGIES = {"keep_latest": True, "delete": False}
_BATCH = 1000  # the service's limit of run ids / conversations per call
_BRANCHING_SOURCES = frozenset({"fork", "update"})


class CheckpointConflict(client.VersionConflict):
    """Another writer extended this thread's history first: this write was refused and
    nothing of it was stored. Re-read the thread (`get_tuple`) before writing again.

    `is_stale_write_owner_error` marks it as a superseded writer's refusal, the name the
    proposed write-ownership capability of langgraph-checkpoint-conformance uses."""

    is_stale_write_owner_error = True


class ThreadDeleted(client.NotFound):
    """The thread was deleted while this saver was writing it: the write was refused,
    so a late write never brings a deleted thread back."""


def _configurable(config: RunnableConfig) -> dict[str, Any]:
    configurable = config.get("configurable")
    if not isinstance(configurable, dict):
        raise ValueError('config must have a "configurable" mapping with a "thread_id"')
    return configurable


def _thread_id(config: RunnableConfig) -> str:
    thread_id = _configurable(config).get("thread_id")
    if thread_id is None or thread_id == "":
        raise ValueError(
            'Checkpointer requires a "thread_id" in config["configurable"] '
            '(for example {"configurable": {"thread_id": "1"}})'
        )
    return str(thread_id)


def _namespace(config: RunnableConfig) -> str:
    return str(_configurable(config).get("checkpoint_ns") or "")


class AgentStateSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that stores threads on the agentstate state service.

    >>> saver = AgentStateSaver("127.0.0.1:50051")          # doctest: +SKIP
    >>> graph = builder.compile(checkpointer=saver)         # doctest: +SKIP

    `user_id` owns the threads (a conversation belongs to one user); a run may name
    another one with config["configurable"]["user_id"].
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        user_id: str = DEFAULT_USER_ID,
        client_async: client.AsyncStateClient | None = None,
        client_sync: client.StateClient | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if target is None and client_async is None and client_sync is None:
            raise ValueError("give the state service's address or a client")
        self._target = target
        self._aclient = client_async
        self._client = client_sync
        self._owns_clients = target is not None
        self.user_id = user_id
        # (user, thread) -> conversation id: threads this saver has seen.
        self._conversations: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------ connections

    @property
    def aclient(self) -> client.AsyncStateClient:
        if self._aclient is None:
            assert self._target is not None
            self._aclient = client.AsyncStateClient(self._target)
        return self._aclient

    @property
    def client(self) -> client.StateClient:
        if self._client is None:
            assert self._target is not None
            self._client = client.StateClient(self._target)
        return self._client

    async def aclose(self) -> None:
        """Close the connections this saver opened (not clients it was given)."""
        if self._owns_clients:
            if self._aclient is not None:
                await self._aclient.close()
            if self._client is not None:
                self._client.close()

    def close(self) -> None:
        if self._owns_clients and self._client is not None:
            self._client.close()

    def _user(self, config: RunnableConfig | None) -> str:
        if config is not None:
            user = _configurable(config).get("user_id")
            if user:
                return str(user)
        return self.user_id

    # ---------------------------------------------------------- thread lookup

    async def _aconversation(self, user: str, thread: str, *, create: bool) -> str | None:
        key = (user, thread)
        found = self._conversations.get(key)
        if found is None:
            try:
                found = await self.aclient.resolve_conversation(user, thread, create=create)
            except client.NotFound:
                return None
            self._conversations[key] = found
        return found

    def _conversation(self, user: str, thread: str, *, create: bool) -> str | None:
        key = (user, thread)
        found = self._conversations.get(key)
        if found is None:
            try:
                found = self.client.resolve_conversation(user, thread, create=create)
            except client.NotFound:
                return None
            self._conversations[key] = found
        return found

    def _forget(self, user: str, thread: str) -> None:
        self._conversations.pop((user, thread), None)

    def _deleted(self, thread: str, exc: client.NotFound) -> ThreadDeleted:
        return ThreadDeleted(exc.code, f"thread {thread!r} was deleted; nothing was written")

    # ------------------------------------------------------- encode / decode

    def _put_request(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> pb.PutCheckpointRequest:
        """Serialize before any call: a value LangGraph's serializer refuses raises its
        own TypeError and nothing is sent."""
        stored = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values")
        new_values = []
        for channel, version in new_versions.items():
            value_type, value = (
                self.serde.dumps_typed(values[channel]) if channel in values else (_EMPTY, b"")
            )
            new_values.append(
                pb.ChannelValue(
                    channel=channel, version=str(version), value_type=value_type, value=value
                )
            )
        checkpoint_type, checkpoint_bytes = self.serde.dumps_typed(stored)
        full_metadata = get_serializable_checkpoint_metadata(config, metadata)
        parent = get_checkpoint_id(config)
        request = pb.PutCheckpointRequest(
            namespace=_namespace(config),
            checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=parent or "",
            checkpoint_type=checkpoint_type,
            checkpoint=checkpoint_bytes,
            metadata_json=json.dumps(full_metadata, ensure_ascii=False).encode(),
            channel_versions={k: str(v) for k, v in checkpoint["channel_versions"].items()},
            new_channel_values=new_values,
        )
        # The head this checkpoint extends: its parent, or none yet for a thread's first
        # checkpoint (LangGraph's input checkpoint, step -1). What the run loop writes
        # ("input", "loop") is checked; forks and update_state ("fork", "update") branch
        # from the checkpoint a caller chose on purpose (time travel), so they are not.
        if metadata.get("source") not in _BRANCHING_SOURCES:
            if parent:
                request.expected_head_checkpoint_id = parent
            elif metadata.get("step") == -1:
                request.expected_head_checkpoint_id = ""
        return request

    def _writes_request(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> pb.PutCheckpointWritesRequest:
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            raise ValueError('put_writes requires config["configurable"]["checkpoint_id"]')
        encoded = []
        for idx, (channel, value) in enumerate(writes):
            value_type, data = self.serde.dumps_typed(value)
            encoded.append(
                pb.CheckpointWrite(
                    task_id=task_id,
                    idx=WRITES_IDX_MAP.get(channel, idx),
                    channel=channel,
                    value_type=value_type,
                    value=data,
                    task_path=task_path,
                )
            )
        return pb.PutCheckpointWritesRequest(
            namespace=_namespace(config), checkpoint_id=checkpoint_id, writes=encoded
        )

    def _list_request(
        self,
        config: RunnableConfig,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> pb.ListCheckpointsRequest:
        request = pb.ListCheckpointsRequest(page_size=min(limit or 100, 100))
        if "checkpoint_ns" in _configurable(config):
            request.namespace = _namespace(config)
        if filter:
            request.metadata_filter_json = json.dumps(filter).encode()
        if before is not None and (before_id := get_checkpoint_id(before)):
            request.before_checkpoint_id = before_id
        return request

    def _tuple(self, thread: str, stored: pb.Checkpoint) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed((stored.checkpoint_type, stored.checkpoint))
        checkpoint["channel_values"] = {
            v.channel: self.serde.loads_typed((v.value_type, v.value))
            for v in stored.channel_values
            if v.value_type != _EMPTY
        }
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": stored.namespace,
                "checkpoint_id": stored.checkpoint_id,
            }
        }
        parent: RunnableConfig | None = None
        if stored.parent_checkpoint_id:
            parent = {
                "configurable": {
                    "thread_id": thread,
                    "checkpoint_ns": stored.namespace,
                    "checkpoint_id": stored.parent_checkpoint_id,
                }
            }
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=json.loads(stored.metadata_json),
            parent_config=parent,
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.value_type, w.value)))
                for w in stored.pending_writes
            ],
        )

    @staticmethod
    def _stored_config(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": _thread_id(config),
                "checkpoint_ns": _namespace(config),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Versions that sort as strings, as LangGraph's PostgreSQL saver writes them."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # ------------------------------------------------------------------ async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        user, thread = self._user(config), _thread_id(config)
        for _ in range(2):
            conversation = await self._aconversation(user, thread, create=False)
            if conversation is None:
                return None
            try:
                stored = await self.aclient.get_checkpoint(
                    user,
                    conversation,
                    namespace=_namespace(config),
                    checkpoint_id=get_checkpoint_id(config) or "",
                )
            except client.NotFound:
                self._forget(user, thread)  # deleted: look the thread up again
                continue
            return None if stored is None else self._tuple(thread, stored)
        return None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is None:
            raise ValueError("list needs a config with a thread_id on the state service")
        user, thread = self._user(config), _thread_id(config)
        conversation = await self._aconversation(user, thread, create=False)
        if conversation is None:
            return
        request = self._list_request(config, filter, before, limit)
        request.user_id, request.conversation_id = user, conversation
        try:
            async for stored in self.aclient.list_checkpoints(request, limit):
                yield self._tuple(thread, stored)
        except client.NotFound:
            self._forget(user, thread)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        request = self._put_request(config, checkpoint, metadata, new_versions)
        user, thread = self._user(config), _thread_id(config)
        conversation = await self._aconversation(user, thread, create=True)
        assert conversation is not None
        request.user_id, request.conversation_id = user, conversation
        try:
            await self.aclient.put_checkpoint(request)
        except client.NotFound as exc:
            self._forget(user, thread)
            raise self._deleted(thread, exc) from exc
        except client.VersionConflict as exc:
            raise CheckpointConflict(exc.code, str(exc)) from exc
        return self._stored_config(config, checkpoint)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        request = self._writes_request(config, writes, task_id, task_path)
        user, thread = self._user(config), _thread_id(config)
        conversation = await self._aconversation(user, thread, create=True)
        assert conversation is not None
        request.user_id, request.conversation_id = user, conversation
        try:
            await self.aclient.put_checkpoint_writes(request)
        except client.NotFound as exc:
            self._forget(user, thread)
            raise self._deleted(thread, exc) from exc

    async def adelete_thread(self, thread_id: str) -> None:
        user, thread = self.user_id, str(thread_id)
        conversation = await self._aconversation(user, thread, create=False)
        self._forget(user, thread)
        if conversation is not None:
            with contextlib.suppress(client.NotFound):  # already gone
                await self.aclient.delete_conversation(user, conversation)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        for start in range(0, len(runs), _BATCH):
            await self.aclient.delete_checkpoints_for_runs(
                self.user_id, runs[start : start + _BATCH]
            )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        user = self.user_id
        source = await self._aconversation(user, str(source_thread_id), create=False)
        if source is None:
            return  # nothing to copy
        target = await self._aconversation(user, str(target_thread_id), create=True)
        assert target is not None
        try:
            await self.aclient.copy_checkpoints(user, source, target)
        except client.FailedPrecondition as exc:
            raise ValueError(f"thread {target_thread_id!r}: {exc}") from exc

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        keep_latest = _prune_strategy(strategy)
        user = self.user_id
        found = [await self._aconversation(user, str(t), create=False) for t in thread_ids]
        ids = [c for c in found if c is not None]
        for start in range(0, len(ids), _BATCH):
            await self.aclient.prune_checkpoints(user, ids[start : start + _BATCH], keep_latest)

    # ------------------------------------------------------------------- sync

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        user, thread = self._user(config), _thread_id(config)
        for _ in range(2):
            conversation = self._conversation(user, thread, create=False)
            if conversation is None:
                return None
            try:
                stored = self.client.get_checkpoint(
                    user,
                    conversation,
                    namespace=_namespace(config),
                    checkpoint_id=get_checkpoint_id(config) or "",
                )
            except client.NotFound:
                self._forget(user, thread)
                continue
            return None if stored is None else self._tuple(thread, stored)
        return None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if config is None:
            raise ValueError("list needs a config with a thread_id on the state service")
        user, thread = self._user(config), _thread_id(config)
        conversation = self._conversation(user, thread, create=False)
        if conversation is None:
            return
        request = self._list_request(config, filter, before, limit)
        request.user_id, request.conversation_id = user, conversation
        try:
            for stored in self.client.list_checkpoints(request, limit):
                yield self._tuple(thread, stored)
        except client.NotFound:
            self._forget(user, thread)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        request = self._put_request(config, checkpoint, metadata, new_versions)
        user, thread = self._user(config), _thread_id(config)
        conversation = self._conversation(user, thread, create=True)
        assert conversation is not None
        request.user_id, request.conversation_id = user, conversation
        try:
            self.client.put_checkpoint(request)
        except client.NotFound as exc:
            self._forget(user, thread)
            raise self._deleted(thread, exc) from exc
        except client.VersionConflict as exc:
            raise CheckpointConflict(exc.code, str(exc)) from exc
        return self._stored_config(config, checkpoint)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        request = self._writes_request(config, writes, task_id, task_path)
        user, thread = self._user(config), _thread_id(config)
        conversation = self._conversation(user, thread, create=True)
        assert conversation is not None
        request.user_id, request.conversation_id = user, conversation
        try:
            self.client.put_checkpoint_writes(request)
        except client.NotFound as exc:
            self._forget(user, thread)
            raise self._deleted(thread, exc) from exc

    def delete_thread(self, thread_id: str) -> None:
        user, thread = self.user_id, str(thread_id)
        conversation = self._conversation(user, thread, create=False)
        self._forget(user, thread)
        if conversation is not None:
            with contextlib.suppress(client.NotFound):  # already gone
                self.client.delete_conversation(user, conversation)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        for start in range(0, len(runs), _BATCH):
            self.client.delete_checkpoints_for_runs(self.user_id, runs[start : start + _BATCH])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        user = self.user_id
        source = self._conversation(user, str(source_thread_id), create=False)
        if source is None:
            return
        target = self._conversation(user, str(target_thread_id), create=True)
        assert target is not None
        try:
            self.client.copy_checkpoints(user, source, target)
        except client.FailedPrecondition as exc:
            raise ValueError(f"thread {target_thread_id!r}: {exc}") from exc

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        keep_latest = _prune_strategy(strategy)
        user = self.user_id
        found = [self._conversation(user, str(t), create=False) for t in thread_ids]
        ids = [c for c in found if c is not None]
        for start in range(0, len(ids), _BATCH):
            self.client.prune_checkpoints(user, ids[start : start + _BATCH], keep_latest)


def _prune_strategy(strategy: str) -> bool:
    if strategy not in _PRUNE_STRATEGIES:
        raise ValueError(f'strategy must be "keep_latest" or "delete", not {strategy!r}')
    return _PRUNE_STRATEGIES[strategy]
