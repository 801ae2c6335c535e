"""AgentStateSaver's asyncio methods, on AsyncStateClient (grpc.aio).

The synchronous ones, saver_sync.py, are generated from this file by scripts/async_to_sync.py.
"""

from __future__ import annotations

import contextlib
import time
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
from agentstate.client.pushback import async_pause
from agentstate.integrations._ttl import TimeToLive
from agentstate.integrations.langgraph.saver_base import (
    BATCH,
    MAX_INDEX_ATTEMPTS,
    PAGE,
    THREAD_TITLE,
    USERS_STATE_KEY,
    WRITES_POLL_SECONDS,
    WRITES_RETRY_SECONDS,
    CheckpointConflict,
    RunLease,
    SaverBase,
    WriteKey,
    langgraph_errors,
    namespace_of,
    partly_deleted,
    prune_strategy,
    refused,
    thread_id_of,
    thread_ids,
    thread_users,
)


class AsyncSaverMethods(SaverBase):
    """The checkpointer's a* methods, each one or two calls of the state service."""

    async def _aconversation(
        self, user: str, thread: str, *, create: bool, ttl: TimeToLive | None = None
    ) -> str | None:
        """The thread's conversation id (None: absent, and not `create`); `ttl`: the time to
        live of one this call creates (never of the saver user's index of a thread's users,
        which delete_thread needs for as long as the thread lives)."""
        key = (user, thread)
        found = self._conversations.get(key)
        if found is None:
            try:
                with langgraph_errors(thread_ids(user, thread)):
                    resolved = await self.aclient.resolve_conversation(
                        user, thread, create=False, title=THREAD_TITLE
                    )
            except state.NotFound:
                if not create:
                    return None
                if user != self.user_id:
                    # Recorded before the thread exists under `user`, so that
                    # delete_thread, which names the thread only, finds it.
                    await self._aindex_user(user, thread)
                with langgraph_errors(thread_ids(user, thread)):
                    resolved = await self.aclient.resolve_conversation(
                        user,
                        thread,
                        create=True,
                        title=THREAD_TITLE,
                        ttl_seconds=ttl.seconds if ttl else None,
                        ttl_renewed_by_writes=ttl.renewed_by_writes if ttl else False,
                    )
            found = resolved.conversation.conversation_id
            self._conversations[key] = found
        return found

    async def _aindex_user(self, user: str, thread: str) -> None:
        """Add `user` to the thread's users, kept in the saver user's conversation of the
        thread (compare-and-set: two writers adding users at once both land)."""
        for _ in range(MAX_INDEX_ATTEMPTS):
            index = await self._aconversation(self.user_id, thread, create=True)
            assert index is not None
            try:
                with langgraph_errors():
                    found = await self.aclient.find_state(
                        self.user_id, index, state_key=USERS_STATE_KEY
                    )
                users = thread_users(found)
                if user in users:
                    return
                with langgraph_errors():
                    await self.aclient.upsert_state(
                        self.user_id,
                        index,
                        {"users": [*users, user]},
                        expected_version=found.version if found is not None else 0,
                        state_key=USERS_STATE_KEY,
                    )
                return
            except state.VersionConflict:
                continue  # another writer added a user: read again
            except state.NotFound:
                self._forget(self.user_id, thread)  # deleted meanwhile: made again
        raise CheckpointConflict(
            f"thread {thread!r}: could not record user {user!r} among the thread's users "
            f"after {MAX_INDEX_ATTEMPTS} attempts (other writers kept changing them); "
            "nothing of this write was stored"
        )

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        user, thread = self._user(config), thread_id_of(config)
        await self._aflush_thread(user, thread)  # a read sees every write acknowledged
        self._deleted_threads.pop((user, thread), None)  # a run starts by reading
        self._refused_threads.pop((user, thread), None)
        self._flush_failed.pop((user, thread), None)  # it reads what is stored
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
            self._remember_latest(user, thread, config, stored.checkpoint_id if stored else "")
            if stored is not None:
                self._stored_here[(user, thread, stored.namespace, stored.checkpoint_id)] = True
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
            await self._aflush_thread(user, thread)
            conversation = await self._aconversation(user, thread, create=False)
            if conversation is None:
                return
            wanted = [(thread, conversation)]
            arguments = self._list_arguments(config, filter, before)
        else:
            every_thread = True
            await self._aflush_thread(user)
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
        user, thread, ttl = self._user(config), thread_id_of(config), self._ttl(config)
        self._writer_conversation_known(user, thread)
        self._refused_before(new, thread)
        self._raise_flush_failure(user, thread)
        conversation = await self._aconversation(user, thread, create=True, ttl=ttl)
        assert conversation is not None
        # The checkpoint's writes wait for this put (aput_writes), and fail with it.
        key = (user, thread, new.namespace, new.checkpoint_id)
        # The parent's writes held for this put go with it, in its transaction.
        parent_key = (user, thread, new.namespace, new.parent_checkpoint_id)
        carried = (
            self._one_call(self._take_held(parent_key, carried=True))
            if new.parent_checkpoint_id
            else []
        )
        if carried and not self._carry(carried):
            await self._asend_when_stored(parent_key, conversation, carried)
            carried = []
        self._start_put(key)
        try:
            await self._aput_checkpoint(
                user, thread, conversation, new, expected_head, checkpoint, metadata, carried
            )
        except BaseException as exc:
            self._end_put(key, exc)
            raise
        self._end_put(key, None)
        return self._stored_config(config, checkpoint)

    async def _aput_checkpoint(
        self,
        user: str,
        thread: str,
        conversation: str,
        new: state.NewCheckpoint,
        expected_head: str | None,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        carried: Sequence[state.CheckpointWrite],
    ) -> None:
        # Subgraphs' checkpoints (a namespace) are written under their parent run's lease,
        # which the root graph's puts take (the run's first), renew and release (its last).
        lease = None
        run = None
        if not new.namespace:
            run = self._leases.get((user, thread))
            if run is not None and self._starts_run(metadata):
                run.stored = []  # a new run of this saver: its lease carries on
            probe = run or RunLease("", time.monotonic())
            lease = self._lease_use(run, self._ends_run(probe, checkpoint, metadata))
            if run is None and lease is not None and not lease.release:
                # Taken by this put: recorded now, so that writes ending the run while
                # it is on the way find it (RunLease.ends_at); its task id comes back.
                run = self._leases[(user, thread)] = probe
        try:
            with langgraph_errors():
                done = await self.aclient.put_checkpoint_step(
                    user,
                    conversation,
                    new,
                    expected_head=expected_head,
                    parent_writes=carried,
                    run_lease=lease,
                )
        except (state.LeaseHeld, state.LeaseLost) as exc:
            stored = run.stored if run is not None else []
            self._leases.pop((user, thread))
            error = refused(thread, new.checkpoint_id, stored, "another run holds it", exc)
            self._refused[new.checkpoint_id] = error
            self._refuse_run(user, thread, error)
            raise error from exc
        except state.NotFound as exc:
            self._leases.pop((user, thread))
            raise self._deleted(user, thread, exc) from exc
        except state.CheckpointConflict as exc:
            stored = run.stored if run is not None else []
            error = refused(
                thread, new.checkpoint_id, stored, "another writer extended its history first", exc
            )
            self._refused[new.checkpoint_id] = error
            self._refuse_run(user, thread, error)
            if run is not None:
                await self._arelease(user, thread)
            raise error from exc
        except BaseException:
            if run is not None and not run.stored:
                await self._arelease(user, thread)  # nothing of the run is stored
            if carried:  # the parent is stored: its writes are not lost with this put
                with contextlib.suppress(Exception):
                    parent = (user, thread, new.namespace, new.parent_checkpoint_id)
                    await self._asend_when_stored(parent, conversation, carried)
            raise
        if lease is not None and lease.release:
            self._leases.pop((user, thread))
            return
        if run is not None and lease is not None and done.lease is not None:
            run.task_id = done.lease.task_id
            run.renewed = time.monotonic()
        if run is not None and self._stored_in_run(run, checkpoint, metadata):
            await self._arelease(user, thread)  # its writes ended the run meanwhile

    async def _arelease(self, user: str, thread: str) -> None:
        run = self._leases.pop((user, thread))
        if run is not None and run.task_id:  # "": its put did not take it
            # A release that fails only lets the lease lapse (run_lease_seconds).
            with contextlib.suppress(state.StateError):
                await self.aclient.release_lease(user, run.task_id)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        namespace, checkpoint_id = self._writes_target(config)
        encoded = self._writes(writes, task_id, task_path)
        user, thread, ttl = self._user(config), thread_id_of(config), self._ttl(config)
        self._writer_conversation_known(user, thread)
        self._writes_refused(checkpoint_id, thread)
        self._raise_flush_failure(user, thread)
        conversation = await self._aconversation(user, thread, create=True, ttl=ttl)
        assert conversation is not None
        key = (user, thread, namespace, checkpoint_id)
        if not self._sent_at_once(encoded):
            if self._hold(key, conversation, encoded):
                self._aschedule_flush(key)
                return  # the put of the checkpoint's child carries them, or the timer
        else:  # the checkpoint's held writes go with these
            encoded = self._one_call([*self._take_held(key, carried=False), *encoded])
        await self._asend_when_stored(key, conversation, encoded)
        if not namespace and self._ended_by(user, thread, checkpoint_id, encoded):
            await self._arelease(user, thread)  # the run interrupted or failed: it ends

    async def _aflush(self, key: WriteKey, *, now: bool = False) -> None:
        """Send the writes held for `key` alone: their child put did not come in time (the
        timer; `now`: a reader needs them). A failure is raised by the thread's next call
        (`_raise_flush_failure`)."""
        if not now and not self._due_to_flush(key):
            if key in self._held_keys(key[0], key[1]):
                self._aschedule_flush(key)  # armed again: its checkpoint is on the way
            return
        with self._lease_lock:
            held = self._held.get(key)
            conversation = held.conversation if held is not None else ""
            since = held.since if held is not None else time.monotonic()
        writes = self._one_call(self._take_held(key, carried=False))
        if not writes:
            return
        try:
            await self._asend_when_stored(key, conversation, writes)
        except (state.CheckpointConflict, state.NotFound):
            pass  # the run was refused, or its thread deleted: its put says so
        except state.CheckpointNotStored as exc:
            # Their checkpoint is not stored and a run of the thread was refused since
            # they arrived: they are that run's (LangGraph sends no put after a refused
            # one), nothing of which is stored, and its caller was told. The thread's
            # refusal is forgotten once a new run reads the thread, which the timer may
            # come after: without this their failure would fail the new run.
            if not self._refused_since(key[0], key[1], since):
                self._flush_failure(key, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            self._flush_failure(key, f"{type(exc).__name__}: {exc}")

    async def _aflush_thread(self, user: str | None = None, thread: str | None = None) -> None:
        """Send the writes held for a thread (every thread: None) now: a read sees them."""
        for key in self._held_keys(user, thread):
            await self._aflush(key, now=True)
        if user is None:  # and the flushes already under way (close)
            await self._await_flushes()

    async def _asend_when_stored(
        self,
        key: WriteKey,
        conversation: str,
        encoded: Sequence[state.CheckpointWrite],
    ) -> None:
        """Send writes once their checkpoint is stored: LangGraph (durability="async")
        sends a step's writes while the step's checkpoint is still being put, or even
        before that put starts; the service refuses writes of a checkpoint it does not
        hold."""
        user, thread, namespace, checkpoint_id = key
        started = time.monotonic()
        retry = WRITES_POLL_SECONDS
        while True:
            if not self._writes_may_go(key):
                await async_pause(WRITES_POLL_SECONDS)  # this saver is putting it
                continue
            try:
                await self._asend_writes(
                    user, thread, conversation, namespace, checkpoint_id, encoded
                )
                return
            except state.CheckpointNotStored as exc:  # its put has not started yet
                error = self._writes_not_stored(key, started, exc)
                if error is not None:
                    raise error from exc
            await async_pause(retry)
            retry = min(retry * 2, WRITES_RETRY_SECONDS)

    async def _asend_writes(
        self,
        user: str,
        thread: str,
        conversation: str,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[state.CheckpointWrite],
    ) -> None:
        try:
            with langgraph_errors():
                await self.aclient.put_checkpoint_writes(
                    user,
                    conversation,
                    namespace=namespace,
                    checkpoint_id=checkpoint_id,
                    writes=writes,
                )
        except state.NotFound as exc:
            raise self._deleted(user, thread, exc) from exc

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread of every user it ran under (the saver's user and each
        config["configurable"]["user_id"]), each conversation with everything of it in
        one transaction. The saver user's conversation, which lists the others, goes
        last: a delete that fails part way says what it did and can be run again."""
        thread = str(thread_id)
        self._drop_held(thread)  # writes held for a put of the thread go with it
        index = await self._aconversation(self.user_id, thread, create=False)
        users: list[str] = []
        if index is not None:
            with contextlib.suppress(state.NotFound), langgraph_errors():
                users = thread_users(
                    await self.aclient.find_state(self.user_id, index, state_key=USERS_STATE_KEY)
                )
        deleted: list[str] = []
        for user in [*[u for u in users if u != self.user_id], self.user_id]:
            try:
                conversation = await self._aconversation(user, thread, create=False)
                self._forget(user, thread)
                if conversation is not None:
                    with contextlib.suppress(state.NotFound):  # already gone
                        await self.aclient.delete_conversation(user, conversation)
            except state.StateError as exc:
                raise partly_deleted(thread, deleted, user, exc) from exc
            deleted.append(user)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        await self._aflush_thread()  # their checkpoints' writes are deleted with them
        for start in range(0, len(runs), BATCH):
            with langgraph_errors():
                await self.aclient.delete_checkpoints_for_runs(
                    self.user_id, runs[start : start + BATCH]
                )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        user = self.user_id
        await self._aflush_thread(user, str(source_thread_id))  # copied with the thread
        source = await self._aconversation(user, str(source_thread_id), create=False)
        if source is None:
            return  # nothing to copy
        target = await self._aconversation(
            user, str(target_thread_id), create=True, ttl=self._ttl(None)
        )
        assert target is not None
        try:
            with langgraph_errors():
                await self.aclient.copy_checkpoints(user, source, target)
        except state.TargetHasCheckpoints as exc:
            raise ValueError(f"thread {target_thread_id!r}: {exc.message}") from exc

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        chosen = prune_strategy(strategy)
        user = self.user_id
        for thread in thread_ids:  # the latest checkpoints keep their writes
            await self._aflush_thread(user, str(thread))
        found = [await self._aconversation(user, str(t), create=False) for t in thread_ids]
        ids = [c for c in found if c is not None]
        for start in range(0, len(ids), BATCH):
            with langgraph_errors():
                await self.aclient.prune_checkpoints(user, ids[start : start + BATCH], chosen)
