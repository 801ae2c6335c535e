"""LangGraph checkpoints, their writes and channel values (a capability)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from agentstate.state_service import domain as d
from agentstate.state_service.crypto import envelope
from agentstate.state_service.domain import (
    Lease,
    Page,
    jsontext,
)
from agentstate.state_service.storage.base.checkpoints import CheckpointStore
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import (
    BigintArray,
    RawJson,
    Row,
    TextArray,
)
from agentstate.state_service.storage.postgres.connection import (
    PostgresConnection,
)
from agentstate.state_service.storage.postgres.encryption import UserKeys, ad

# With encryption on, a sealed binary value's type column starts with U+0001 (a type a
# caller sends never does: checked below), so plaintext rows read as they did.
SEALED_TYPE = "\x01"


def checkpoint_ad(user_id: str, kind: str, row_key: str) -> bytes:
    """Checkpoint values are bound to their user, their kind and their key in the
    conversation (channel and version, task and index, checkpoint id), not to the
    conversation: CopyCheckpoints copies them to another one as they are."""
    return ad(user_id, "", kind, row_key)


def _search_copy(metadata: bytes, sealed: bool) -> bytes:
    """The searchable copy: with encryption on, only the top-level members whose values
    are scalars (what filters and run_id use) stay readable; the rest is sealed only."""
    copy = d.metadata_search_copy(metadata)
    if not sealed:
        return copy
    members = json.loads(copy)
    return json.dumps(
        {k: v for k, v in members.items() if v is None or isinstance(v, str | int | float | bool)},
        ensure_ascii=False,
    ).encode()


def _check_type(value_type: str, what: str) -> None:
    if value_type.startswith(SEALED_TYPE):
        raise d.InvalidArgument(f"{what} must not start with U+0001")


def _open_value(
    key: envelope.DataKey | None, user_id: str, value_type: str, value: bytes, bound: bytes
) -> tuple[str, bytes]:
    if not value_type.startswith(SEALED_TYPE):
        return value_type, value
    return value_type[1:], envelope.open_bytes(key, value, bound, user_id=user_id)


async def open_checkpoint(keys: UserKeys, row: Row) -> d.StoredCheckpoint:
    """A checkpoint row with its sealed parts opened."""
    stored = checkpoint_of(row)
    metadata = stored.metadata_json
    types = [
        stored.checkpoint_type,
        *(v.value_type for v in stored.channel_values),
        *(w.value_type for w in stored.pending_writes),
    ]
    if not any(t.startswith(SEALED_TYPE) for t in types) and b"\x01" not in metadata:
        return stored
    user = keys.user_id
    key = await keys.for_read("\x01")
    checkpoint_type, checkpoint = _open_value(
        key,
        user,
        stored.checkpoint_type,
        stored.checkpoint,
        checkpoint_ad(user, "checkpoint", f"{stored.namespace}\0{stored.checkpoint_id}"),
    )
    values = []
    for v in stored.channel_values:
        value_type, value = _open_value(
            key,
            user,
            v.value_type,
            v.value,
            checkpoint_ad(
                user, "checkpoint.blob", _blob_key(stored.namespace, v.channel, v.version)
            ),
        )
        values.append(d.ChannelValue(v.channel, v.version, value_type, value))
    writes = []
    for w in stored.pending_writes:
        value_type, value = _open_value(
            key,
            user,
            w.value_type,
            w.value,
            checkpoint_ad(
                user, "checkpoint.write", _write_key(stored.namespace, stored.checkpoint_id, w)
            ),
        )
        writes.append(dataclasses.replace(w, value_type=value_type, value=value))
    return dataclasses.replace(
        stored,
        checkpoint_type=checkpoint_type,
        checkpoint=checkpoint,
        metadata_json=await keys.open(
            metadata,
            checkpoint_ad(
                user, "checkpoint.metadata", f"{stored.namespace}\0{stored.checkpoint_id}"
            ),
        ),
        channel_values=values,
        pending_writes=writes,
    )


def _blob_key(namespace: str, channel: str, version: str) -> str:
    return f"{namespace}\0{channel}\0{version}"


def _write_key(namespace: str, checkpoint_id: str, write: d.CheckpointWrite) -> str:
    return f"{namespace}\0{checkpoint_id}\0{write.task_id}\0{write.idx}"


async def _sealed_writes(
    keys: UserKeys,
    user_id: str,
    namespace: str,
    checkpoint_id: str,
    writes: Sequence[d.CheckpointWrite],
) -> tuple[list[str], list[bytes]]:
    """The writes' value types and values as stored: sealed, each bound to its write,
    when encryption is on."""
    for w in writes:
        _check_type(w.value_type, "writes.value_type")
    if not keys.on or not writes:
        return [w.value_type for w in writes], [w.value for w in writes]
    key = await keys.for_write()
    return [SEALED_TYPE + w.value_type for w in writes], [
        envelope.seal_bytes(
            key,
            w.value,
            checkpoint_ad(user_id, "checkpoint.write", _write_key(namespace, checkpoint_id, w)),
        )
        for w in writes
    ]


def checkpoint_of(row: Row) -> d.StoredCheckpoint:
    def column(name: str) -> list[Any]:
        return row[name] or []  # array_agg over no rows is NULL

    return d.StoredCheckpoint(
        conversation_id=int(row["conversation_id"]),
        namespace=row["namespace"],
        checkpoint_id=row["checkpoint_id"],
        parent_checkpoint_id=row["parent_checkpoint_id"],
        checkpoint_type=row["checkpoint_type"],
        checkpoint=bytes(row["checkpoint"]),
        metadata_json=row["metadata"].encode(),
        channel_versions=json.loads(row["channel_versions"]),
        channel_values=[
            d.ChannelValue(channel, version, value_type, bytes(value))
            for channel, version, value_type, value in zip(
                column("channels"),
                column("versions"),
                column("value_types"),
                column("values"),
                strict=True,
            )
        ],
        pending_writes=[
            d.CheckpointWrite(task_id, int(idx), channel, value_type, bytes(value), task_path)
            for task_id, idx, channel, value_type, value, task_path in zip(
                column("task_ids"),
                column("idxs"),
                column("write_channels"),
                column("write_types"),
                column("write_values"),
                column("task_paths"),
                strict=True,
            )
        ],
        create_time=row["create_time"],
    )


class PostgresCheckpoints(PostgresConnection, CheckpointStore):
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
        d.check_json_depth(checkpoint.metadata_json, "metadata_json")
        jsontext.check_json(checkpoint.metadata_json, dict, "metadata_json")
        values = checkpoint.new_values
        keys = self._keys(user_id)
        checkpoint_type = checkpoint.checkpoint_type
        stored_checkpoint = checkpoint.checkpoint
        metadata_text = checkpoint.metadata_json.decode()
        value_types = [v.value_type for v in values]
        value_bytes = [v.value for v in values]
        _check_type(checkpoint_type, "checkpoint_type")
        for v in values:
            _check_type(v.value_type, "channel_values.value_type")
        if keys.on:
            key = await keys.for_write()
            at = f"{checkpoint.namespace}\0{checkpoint.checkpoint_id}"
            checkpoint_type = SEALED_TYPE + checkpoint_type
            stored_checkpoint = envelope.seal_bytes(
                key, stored_checkpoint, checkpoint_ad(user_id, "checkpoint", at)
            )
            metadata_text = envelope.seal_text(
                key, metadata_text, checkpoint_ad(user_id, "checkpoint.metadata", at)
            )
            value_types = [SEALED_TYPE + t for t in value_types]
            value_bytes = [
                envelope.seal_bytes(
                    key,
                    v.value,
                    checkpoint_ad(
                        user_id,
                        "checkpoint.blob",
                        _blob_key(checkpoint.namespace, v.channel, v.version),
                    ),
                )
                for v in values
            ]
        arguments: dict[str, Any] = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "namespace": checkpoint.namespace,
            "checkpoint_id": checkpoint.checkpoint_id,
            "parent_id": checkpoint.parent_checkpoint_id,
            "checkpoint_type": checkpoint_type,
            "checkpoint": stored_checkpoint,
            "metadata": RawJson(_search_copy(checkpoint.metadata_json, keys.on)),
            "metadata_text": metadata_text,
            "channel_versions": RawJson(json.dumps(checkpoint.channel_versions).encode()),
            "check_head": expected_head is not None,
            "expected_head": expected_head or "",
            "channels": TextArray([v.channel for v in values]),
            "versions": TextArray([v.version for v in values]),
            "value_types": TextArray(value_types),
            "values": value_bytes,
        }
        if not parent_writes and lease is None:
            rows = await self._rows(sql.PUT_CHECKPOINT, arguments, json_param="metadata_json")
            return d.PutCheckpointResult(rows[0]["create_time"])
        writes = parent_writes
        write_types, write_values = await _sealed_writes(
            keys, user_id, checkpoint.namespace, checkpoint.parent_checkpoint_id or "", writes
        )
        arguments.update(
            task_ids=TextArray([w.task_id for w in writes]),
            idxs=BigintArray([w.idx for w in writes]),
            write_channels=TextArray([w.channel for w in writes]),
            write_types=TextArray(write_types),
            write_values=write_values,
            task_paths=TextArray([w.task_path for w in writes]),
            lease_holder=lease.holder if lease is not None else "",
            lease_task_id=lease.task_id if lease is not None else None,
            lease_ttl_ms=lease.ttl_ms if lease is not None else 0,
            lease_release=lease.release if lease is not None else False,
        )
        (row,) = await self._rows(sql.PUT_CHECKPOINT_STEP, arguments, json_param="metadata_json")
        held = None
        if row["lease_expire_time"] is not None:
            held = Lease(
                task_id=int(row["lease_task_id"]),
                conversation_id=conversation_id,
                user_id=user_id,
                holder=lease.holder if lease is not None else "",
                expire_time=row["lease_expire_time"],
                stop_requested=bool(row["lease_stop_requested"]),
            )
        return d.PutCheckpointResult(row["create_time"], held)

    async def _select_checkpoints(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str | None,
        checkpoint_id: str | None = None,
        metadata_filter: bytes | None = None,
        before_checkpoint_id: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int,
    ) -> list[d.StoredCheckpoint]:
        rows = await self._rows(
            sql.SELECT_CHECKPOINTS,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "namespace": namespace,
                "checkpoint_id": checkpoint_id,
                "before": before_checkpoint_id,
                "after_id": after[0] if after else None,
                "after_ns": after[1] if after else None,
                "filter": RawJson(metadata_filter) if metadata_filter else None,
                "limit": limit,
            },
            json_param="metadata_filter_json",
            binary=True,
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        keys = self._keys(user_id)
        return [
            await open_checkpoint(keys, row) for row in rows if row["checkpoint_id"] is not None
        ]

    async def get_checkpoint(
        self, *, user_id: str, conversation_id: int, namespace: str, checkpoint_id: str | None
    ) -> d.StoredCheckpoint | None:
        found = await self._select_checkpoints(
            user_id=user_id,
            conversation_id=conversation_id,
            namespace=namespace,
            checkpoint_id=checkpoint_id,
            limit=1,
        )
        return found[0] if found else None

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
        found = await self._select_checkpoints(
            user_id=user_id,
            conversation_id=conversation_id,
            namespace=namespace,
            metadata_filter=metadata_filter,
            before_checkpoint_id=before_checkpoint_id,
            after=after,
            limit=page_size + 1,  # one more tells whether there is a next page
        )
        page = found[:page_size]
        token = ""
        if len(found) > page_size:
            token = d.checkpoint_page_token(page[-1].checkpoint_id, page[-1].namespace)
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
        value_types, value_bytes = await _sealed_writes(
            self._keys(user_id), user_id, namespace, checkpoint_id, writes
        )
        rows = await self._rows(
            sql.PUT_CHECKPOINT_WRITES,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "namespace": namespace,
                "checkpoint_id": checkpoint_id,
                "task_ids": TextArray([w.task_id for w in writes]),
                "idxs": BigintArray([w.idx for w in writes]),
                "channels": TextArray([w.channel for w in writes]),
                "value_types": TextArray(value_types),
                "values": value_bytes,
                "task_paths": TextArray([w.task_path for w in writes]),
            },
        )
        return int(rows[0]["stored"])

    async def delete_checkpoints_for_runs(self, *, user_id: str, run_ids: Sequence[str]) -> int:
        rows = await self._rows(
            sql.DELETE_CHECKPOINTS_FOR_RUNS, {"user_id": user_id, "run_ids": TextArray(run_ids)}
        )
        return int(rows[0]["deleted"])

    async def copy_checkpoints(
        self, *, user_id: str, source_conversation_id: int, target_conversation_id: int
    ) -> int:
        rows = await self._rows(
            sql.COPY_CHECKPOINTS,
            {
                "user_id": user_id,
                "source": source_conversation_id,
                "target": target_conversation_id,
            },
        )
        return int(rows[0]["copied"])

    async def prune_checkpoints(
        self, *, user_id: str, conversation_ids: Sequence[int], strategy: d.PruneStrategy
    ) -> int:
        rows = await self._rows(
            sql.PRUNE_CHECKPOINTS,
            {
                "user_id": user_id,
                "ids": BigintArray(sorted(set(conversation_ids))),
                "keep_latest": strategy is d.PruneStrategy.KEEP_LATEST,
            },
        )
        return int(rows[0]["deleted"])
