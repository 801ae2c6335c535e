"""LangGraph checkpoints in memory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    Lease,
    NotFound,
    Page,
    jsontext,
)
from agentstate.state_service.storage.base.checkpoints import CheckpointStore
from agentstate.state_service.storage.memory.tables import (
    CheckpointRow,
    MemoryTables,
    utc_now,
)


class MemoryCheckpoints(MemoryTables, CheckpointStore):
    def _head(self, conversation_id: int, namespace: str) -> str:
        ids = [cid for ns, cid in self._checkpoints.get(conversation_id, {}) if ns == namespace]
        return max(ids, default="")

    async def put_checkpoint(
        self,
        *,
        user_id: str,
        conversation_id: int,
        checkpoint: d.NewCheckpoint,
        expected_head: str | None,
        parent_writes: Sequence[d.CheckpointWrite] = (),
        lease: d.CheckpointRunLease | None = None,
    ) -> d.PutCheckpointResult:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            d.check_json_depth(checkpoint.metadata_json, "metadata_json")
            jsontext.check_json(checkpoint.metadata_json, dict, "metadata_json")
            rows = self._checkpoints.setdefault(conversation_id, {})
            key = (checkpoint.namespace, checkpoint.checkpoint_id)
            if expected_head is not None and key not in rows:
                head = self._head(conversation_id, checkpoint.namespace)
                if head != expected_head:
                    raise d.CheckpointConflict(checkpoint.namespace, expected_head, head)
            parent = checkpoint.parent_checkpoint_id or ""
            if parent_writes and (checkpoint.namespace, parent) not in rows:
                raise d.checkpoint_not_stored(checkpoint.namespace, parent)
            held = self._put_lease_check(user_id, conversation_id, lease)
            # Every check passed: now the changes, all of them.
            values = self._channel_values.setdefault(conversation_id, {})
            for value in checkpoint.new_values:
                values.setdefault((checkpoint.namespace, value.channel, value.version), value)
            if parent_writes:
                self._store_writes(conversation_id, checkpoint.namespace, parent, parent_writes)
            now = utc_now()
            rows[key] = CheckpointRow(checkpoint, now)
            self._touch(conversation)
            return d.PutCheckpointResult(
                now, self._put_lease_apply(user_id, conversation_id, lease, held)
            )

    def _put_lease_check(
        self, user_id: str, conversation_id: int, lease: d.CheckpointRunLease | None
    ) -> Lease | None:
        """Refuse the put's lease use before anything changes; the lease it renews."""
        if lease is None:
            return None
        if lease.task_id is None:
            self._check_lease(user_id, conversation_id, 0)
            return None
        held = self._lease_of_task(user_id, lease.task_id)
        if held is None and lease.ttl_ms > 0:
            raise d.LeaseLost(f"lease of task {lease.task_id} was lost (released or taken over)")
        return held

    def _put_lease_apply(
        self,
        user_id: str,
        conversation_id: int,
        lease: d.CheckpointRunLease | None,
        held: Lease | None,
    ) -> Lease | None:
        if lease is None:
            return None
        if lease.task_id is None:
            held = self._new_lease(user_id, conversation_id, lease.holder, lease.ttl_ms)
        elif held is not None and lease.ttl_ms > 0:
            held = replace(held, expire_time=utc_now() + timedelta(milliseconds=lease.ttl_ms))
            self._leases[held.conversation_id] = held
        if lease.release:
            if held is not None:
                del self._leases[held.conversation_id]
            return None
        return held

    def _stored(self, conversation_id: int, row: CheckpointRow) -> d.StoredCheckpoint:
        cp = row.checkpoint
        values = self._channel_values.get(conversation_id, {})
        channel_values = [
            values[(cp.namespace, channel, version)]
            for channel, version in cp.channel_versions.items()
            if (cp.namespace, channel, version) in values
        ]
        writes = sorted(
            (
                w
                for (ns, cid, _, _), w in self._checkpoint_writes.get(conversation_id, {}).items()
                if ns == cp.namespace and cid == cp.checkpoint_id
            ),
            key=lambda w: (w.task_path, w.task_id, w.idx),
        )
        return d.StoredCheckpoint(
            conversation_id=conversation_id,
            namespace=cp.namespace,
            checkpoint_id=cp.checkpoint_id,
            parent_checkpoint_id=cp.parent_checkpoint_id,
            checkpoint_type=cp.checkpoint_type,
            checkpoint=cp.checkpoint,
            metadata_json=cp.metadata_json,
            channel_versions=dict(cp.channel_versions),
            channel_values=channel_values,
            pending_writes=writes,
            create_time=row.create_time,
        )

    async def get_checkpoint(
        self, *, user_id: str, conversation_id: int, namespace: str, checkpoint_id: str | None
    ) -> d.StoredCheckpoint | None:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            wanted = checkpoint_id or self._head(conversation_id, namespace)
            row = self._checkpoints.get(conversation_id, {}).get((namespace, wanted))
            return None if row is None else self._stored(conversation_id, row)

    async def list_checkpoints(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str | None,
        metadata_filter: bytes | None,
        before_checkpoint_id: str | None,
        page_size: int,
        after: tuple[str, str] | None,
    ) -> Page[d.StoredCheckpoint]:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            wanted = json.loads(metadata_filter) if metadata_filter else None
            chosen = []
            for (ns, cid), row in self._checkpoints.get(conversation_id, {}).items():
                if namespace is not None and ns != namespace:
                    continue
                if before_checkpoint_id is not None and cid >= before_checkpoint_id:
                    continue
                if after is not None and (cid, ns) >= after:
                    continue
                if wanted is not None and not d.json_contains(
                    json.loads(row.checkpoint.metadata_json), wanted
                ):
                    continue
                chosen.append(((cid, ns), row))
            chosen.sort(key=lambda item: item[0], reverse=True)
            page = [self._stored(conversation_id, row) for _, row in chosen[:page_size]]
            token = ""
            if len(chosen) > page_size:
                last = page[-1]
                token = d.checkpoint_page_token(last.checkpoint_id, last.namespace)
            return Page(page, token)

    async def put_checkpoint_writes(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[d.CheckpointWrite],
    ) -> int:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            if (namespace, checkpoint_id) not in self._checkpoints.get(conversation_id, {}):
                raise d.checkpoint_not_stored(namespace, checkpoint_id)
            return self._store_writes(conversation_id, namespace, checkpoint_id, writes)

    def _store_writes(
        self,
        conversation_id: int,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[d.CheckpointWrite],
    ) -> int:
        stored = self._checkpoint_writes.setdefault(conversation_id, {})
        count = 0
        for write in writes:
            key = (namespace, checkpoint_id, write.task_id, write.idx)
            if key in stored and write.idx >= 0:
                continue  # a retried write: the first one stays
            stored[key] = write
            count += 1
        return count

    def _drop_checkpoints(self, conversation_id: int, doomed: set[tuple[str, str]]) -> None:
        """Remove checkpoints, the writes and values no remaining checkpoint has."""
        rows = self._checkpoints.get(conversation_id, {})
        for key in doomed:
            del rows[key]
        writes = self._checkpoint_writes.get(conversation_id, {})
        for wkey in [k for k in writes if (k[0], k[1]) not in rows]:
            del writes[wkey]
        used = {
            (row.checkpoint.namespace, channel, version)
            for row in rows.values()
            for channel, version in row.checkpoint.channel_versions.items()
        }
        values = self._channel_values.get(conversation_id, {})
        for vkey in [k for k in values if k not in used]:
            del values[vkey]

    async def delete_checkpoints_for_runs(self, *, user_id: str, run_ids: Sequence[str]) -> int:
        async with self._lock:
            runs = set(run_ids)
            deleted = 0
            for conversation_id, rows in self._checkpoints.items():
                if self._conversations[conversation_id].user_id != user_id:
                    continue
                doomed = {k for k, row in rows.items() if row.checkpoint.run_id() in runs}
                if doomed:
                    self._drop_checkpoints(conversation_id, doomed)
                    deleted += len(doomed)
            return deleted

    async def copy_checkpoints(
        self, *, user_id: str, source_conversation_id: int, target_conversation_id: int
    ) -> int:
        async with self._lock:
            self._conversation(user_id, source_conversation_id)
            target = self._conversation(user_id, target_conversation_id)
            if self._checkpoints.get(target_conversation_id):
                raise d.target_has_checkpoints(target_conversation_id)
            rows = self._checkpoints.get(source_conversation_id, {})
            self._checkpoints[target_conversation_id] = {
                k: CheckpointRow(row.checkpoint, row.create_time) for k, row in rows.items()
            }
            self._channel_values[target_conversation_id] = dict(
                self._channel_values.get(source_conversation_id, {})
            )
            self._checkpoint_writes[target_conversation_id] = dict(
                self._checkpoint_writes.get(source_conversation_id, {})
            )
            self._touch(target)
            return len(rows)

    async def prune_checkpoints(
        self, *, user_id: str, conversation_ids: Sequence[int], strategy: d.PruneStrategy
    ) -> int:
        async with self._lock:
            wanted = sorted(set(conversation_ids))
            for conversation_id in wanted:
                try:
                    self._conversation(user_id, conversation_id)
                except NotFound:
                    raise NotFound(
                        f"conversation {conversation_id} not found; nothing was pruned"
                    ) from None
            deleted = 0
            for conversation_id in wanted:
                rows = self._checkpoints.get(conversation_id, {})
                doomed = set(rows)
                if strategy is d.PruneStrategy.KEEP_LATEST:
                    for namespace in {ns for ns, _ in rows}:
                        doomed.discard((namespace, self._head(conversation_id, namespace)))
                self._drop_checkpoints(conversation_id, doomed)
                deleted += len(doomed)
            return deleted
