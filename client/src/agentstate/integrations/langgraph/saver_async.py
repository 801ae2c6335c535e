"""AgentStateSaver's asyncio methods, on AsyncStateClient (grpc.aio).

The synchronous ones, saver_sync.py, are generated from this file by scripts/async_to_sync.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)

from agentstate import client as state
from agentstate.integrations.langgraph.saver_base import (
    BATCH,
    PAGE,
    THREAD_TITLE,
    CheckpointConflict,
    SaverBase,
    langgraph_errors,
    namespace_of,
    prune_strategy,
    thread_id_of,
)


class AsyncSaverMethods(SaverBase):
    """The checkpointer's a* methods, each one or two calls of the state service."""

    async def _aconversation(self, user: str, thread: str, *, create: bool) -> str | None:
        key = (user, thread)
        found = self._conversations.get(key)
        if found is None:
            try:
                with langgraph_errors():
                    resolved = await self.aclient.resolve_conversation(
                        user, thread, create=create, title=THREAD_TITLE
                    )
            except state.NotFound:
                return None
            found = self._conversations[key] = resolved.conversation.conversation_id
        return found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        user, thread = self._user(config), thread_id_of(config)
        self._deleted_threads.pop((user, thread), None)  # a run starts by reading
        for _ in range(2):  # once more when the thread was deleted and made again
            conversation = await self._aconversation(user, thread, create=False)
            if conversation is None:
                return None
            try:
                with langgraph_errors():
                    stored = await self.aclient.get_checkpoint(
                        user,
                        conversation,
                        namespace=namespace_of(config),
                        checkpoint_id=get_checkpoint_id(config) or "",
                    )
            except state.NotFound:
                self._forget(user, thread)
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
        # No thread_id (config None, or none in it): every thread of the user (the
        # saver's user_id, or the config's), newest thread first, each newest checkpoint
        # first; one ListConversations call per page of threads.
        user = self._user(config)
        if config is not None and (config.get("configurable") or {}).get("thread_id"):
            every_thread = False
            thread = thread_id_of(config)
            conversation = await self._aconversation(user, thread, create=False)
            if conversation is None:
                return
            wanted = [(thread, conversation)]
            arguments = self._list_arguments(config, filter, before)
        else:
            every_thread = True
            wanted = []
            arguments = {
                "namespace": None,
                "metadata_filter": filter or None,
                "before_checkpoint_id": (get_checkpoint_id(before) or "") if before else "",
            }
        left = limit
        threads_token = ""
        while True:
            if every_thread:
                with langgraph_errors():
                    found = await self.aclient.search_conversations(
                        user, page_size=500, page_token=threads_token
                    )
                wanted = [
                    (c.external_key, c.conversation_id) for c in found.items if c.external_key
                ]
                threads_token = found.next_page_token
            for thread, conversation in wanted:
                page_size, token = min(left or PAGE, PAGE), ""
                while left is None or left > 0:
                    try:
                        with langgraph_errors():
                            page = await self.aclient.list_checkpoints(
                                user,
                                conversation,
                                page_size=page_size,
                                page_token=token,
                                **arguments,
                            )
                    except state.NotFound:  # deleted meanwhile
                        self._forget(user, thread)
                        break
                    for stored in page.items[:left]:
                        yield self._tuple(thread, stored)
                    left = None if left is None else left - len(page.items)
                    token = page.next_page_token
                    if not token:
                        break
                if left is not None and left <= 0:
                    return
            if not every_thread or not threads_token:
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        new, expected_head = self._new_checkpoint(config, checkpoint, metadata, new_versions)
        user, thread = self._user(config), thread_id_of(config)
        self._writer_conversation_known(user, thread)
        conversation = await self._aconversation(user, thread, create=True)
        assert conversation is not None
        try:
            with langgraph_errors():
                await self.aclient.put_checkpoint(
                    user, conversation, new, expected_head=expected_head
                )
        except state.NotFound as exc:
            raise self._deleted(user, thread, exc) from exc
        except state.CheckpointConflict as exc:
            raise CheckpointConflict.of(exc) from exc
        return self._stored_config(config, checkpoint)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        namespace, checkpoint_id = self._writes_target(config)
        encoded = self._writes(writes, task_id, task_path)
        user, thread = self._user(config), thread_id_of(config)
        self._writer_conversation_known(user, thread)
        conversation = await self._aconversation(user, thread, create=True)
        assert conversation is not None
        try:
            with langgraph_errors():
                await self.aclient.put_checkpoint_writes(
                    user,
                    conversation,
                    namespace=namespace,
                    checkpoint_id=checkpoint_id,
                    writes=encoded,
                )
        except state.NotFound as exc:
            raise self._deleted(user, thread, exc) from exc

    async def adelete_thread(self, thread_id: str) -> None:
        user, thread = self.user_id, str(thread_id)
        conversation = await self._aconversation(user, thread, create=False)
        self._forget(user, thread)
        if conversation is not None:
            with contextlib.suppress(state.NotFound):  # already gone
                await self.aclient.delete_conversation(user, conversation)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        for start in range(0, len(runs), BATCH):
            with langgraph_errors():
                await self.aclient.delete_checkpoints_for_runs(
                    self.user_id, runs[start : start + BATCH]
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
        except state.TargetHasCheckpoints as exc:
            raise ValueError(f"thread {target_thread_id!r}: {exc.message}") from exc

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        chosen = prune_strategy(strategy)
        user = self.user_id
        found = [await self._aconversation(user, str(t), create=False) for t in thread_ids]
        ids = [c for c in found if c is not None]
        for start in range(0, len(ids), BATCH):
            await self.aclient.prune_checkpoints(user, ids[start : start + BATCH], chosen)
