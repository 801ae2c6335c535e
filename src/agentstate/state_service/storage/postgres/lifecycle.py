"""The data lifecycle in PostgreSQL: labels and time to live, the conversation search,
expiry, and erasing a user in batches (issue 23)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    Conversation,
    ConversationFilter,
    DeleteCounts,
    ErasureReceipt,
    LabelChange,
    Page,
)
from agentstate.state_service.storage.base.lifecycle import (
    ConversationSearch,
    EraseSettings,
    LifecycleStore,
    TtlChange,
)
from agentstate.state_service.storage.postgres import lifecycle_sql as lsql
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import Row
from agentstate.state_service.storage.postgres.connection import PostgresConnection
from agentstate.state_service.storage.postgres.conversations import (
    conversation_of,
    delete_selected,
    ttl_params,
)
from agentstate.state_service.storage.postgres.encryption import SELECT_USER_KEY
from agentstate.state_service.storage.postgres.states import state_ad

log = logging.getLogger(__name__)


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with `prefix`."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def search_params(where: ConversationFilter) -> tuple[list[str], dict[str, Any]]:
    """The clauses that apply and their parameters."""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if where.user_id is not None:
        clauses.append("user")
        params["user_id"] = where.user_id
    if where.key_prefix:
        clauses.append("key_prefix")
        params["key_like"] = like_prefix(where.key_prefix)
    if where.title_prefix:
        clauses.append("title_prefix")
        params["title_prefix"] = where.title_prefix
    if where.updated_after is not None:
        clauses.append("updated_after")
        params["updated_after"] = where.updated_after
    if where.updated_before is not None:
        clauses.append("updated_before")
        params["updated_before"] = where.updated_before
    selector = where.selector
    if selector.equal:
        clauses.append("label_equal")
        params["label_equal"] = json.dumps(dict(selector.equal))
    if selector.present:
        clauses.append("label_present")
        params["label_present"] = list(selector.present)
    if selector.absent:
        clauses.append("label_absent")
        params["label_absent"] = list(selector.absent)
    if selector.not_equal:
        clauses.append("label_not_equal")
        params["label_not_equal"] = json.dumps(dict(selector.not_equal))
    if where.statuses:
        params["statuses"] = sorted(where.statuses)
        open_only = {d.ConversationStatus.RUNNING, d.ConversationStatus.AWAITING_CONFIRMATION}
        failing = {*open_only, d.ConversationStatus.FAILED}
        if where.user_id is not None and where.statuses <= open_only:
            clauses.append("open_candidates")
        elif (
            where.user_id is not None
            and where.statuses <= failing
            and where.statuses != {d.ConversationStatus.FAILED}
        ):
            clauses.append("failed_candidates")
    return clauses, params


def receipt_of(row: Row) -> ErasureReceipt:
    counts = json.loads(row["counts"])
    return ErasureReceipt(
        erasure_id=int(row["id"]),
        done=bool(row["done"]),
        counts={kind: int(counts.get(kind, 0)) for kind in d.ERASED_KINDS},
        start_time=row["start_time"],
        end_time=row["end_time"],
    )


class ErasePace:
    """How an erase yields to other users' calls (issue 23): each batch (a transaction)
    holds about `batch_rows` rows, not a fixed number of conversations, so it commits
    soon, holds few locks and writes little WAL at once, whatever the user's conversations
    hold; and after each batch the erase rests in proportion to the batch's own time in
    the database (the duty cycle), so a slow database (a loaded machine) slows the erase
    with it instead of being kept busy by it."""

    def __init__(self, settings: EraseSettings) -> None:
        self.settings = settings
        # The first batch: one conversation, to learn how many rows one holds.
        self.conversations = 1
        self.batches = 0  # so far, with the time spent in them and resting after them
        self.busy_seconds = 0.0
        self.rest_seconds = 0.0

    def after(self, counts: dict[str, int], seconds: float) -> float:
        """The pause after a batch that erased `counts` (its receipt counts) in `seconds`,
        and the next batch's size (`conversations`) from the rows it held."""
        s = self.settings
        erased = int(counts.get("conversations", 0))
        rows = sum(int(n) for n in counts.values())
        if erased > 0:
            per_conversation = max(1.0, rows / erased)
            fit = int(s.batch_rows / per_conversation)
            self.conversations = max(1, min(s.batch_conversations, fit))
        rest = seconds * (1 - s.duty_cycle) / s.duty_cycle
        # Bounded so that the heartbeat the batch wrote stays fresh: a pause past the
        # stale time would let another EraseUser take the erase over.
        pause = min(max(s.pause_seconds, rest), s.stale_seconds / 4)
        self.finished(seconds)
        self.rest_seconds += pause
        return pause

    def finished(self, seconds: float) -> None:
        """Count a batch that took `seconds` in the database (the last one rests after
        nothing)."""
        self.batches += 1
        self.busy_seconds += seconds


class PostgresLifecycle(PostgresConnection, LifecycleStore):
    async def set_conversation_facts(
        self, *, user_id: str, conversation_id: int, labels: LabelChange, ttl: TtlChange
    ) -> Conversation:
        params = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "set_labels": json.dumps(dict(labels.set_labels)),
            "remove_labels": list(labels.remove_labels),
            "max_labels": d.MAX_LABELS,
            "clear_ttl": ttl.clear,
            **ttl_params(ttl.ttl),
        }
        rows = await self._rows(lsql.UPDATE_CONVERSATION, params)
        if rows:
            return conversation_of(rows[0])
        # Absent (NOT_FOUND), or there (the change would leave too many labels).
        existing = await self._rows(
            sql.SELECT_CONVERSATION, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not existing:
            raise d.conversation_not_found(conversation_id)
        raise d.InvalidArgument(
            f"a conversation has at most {d.MAX_LABELS} labels; this change would leave more"
        )

    async def search_conversations(
        self,
        *,
        where: ConversationFilter,
        page_size: int,
        before_id: int | None,
        include_total: bool = False,
        include_state_key: str = "",
    ) -> ConversationSearch:
        clauses, params = search_params(where)
        # One user's FAILED conversations: walk the ERROR records' index; else one user's
        # label equality: walk that label's index rows (flat at any size).
        by_failure = where.user_id is not None and where.statuses == {d.ConversationStatus.FAILED}
        by_label = not by_failure and where.user_id is not None and bool(where.selector.equal)
        if by_label:
            params["drive_key"], params["drive_value"] = sorted(where.selector.equal.items())[0]
        total = None
        if include_total:
            (row,) = await self._rows(
                lsql.count_statement(
                    clauses,
                    statuses=bool(where.statuses),
                    by_label=by_label,
                    by_failure=by_failure,
                    limit=d.MAX_COUNTED_TOTAL + 1,
                ),
                params,
            )
            total = int(row["total"])
        if before_id is not None:
            clauses.append("before")
            params["before_id"] = before_id
        if include_state_key:
            params["state_key"] = include_state_key
        statement = lsql.search_statement(
            clauses,
            statuses=bool(where.statuses),
            state=bool(include_state_key),
            by_label=by_label,
            by_failure=by_failure,
            limit=page_size + 1,
        )
        rows = await self._rows(statement, params)
        items = [conversation_of(r) for r in rows[:page_size]]
        states = {}
        for r in rows[:page_size]:
            if include_state_key and r["state_payload"] is not None:
                owner = r["user_id"]  # across users, each state opens with its own key
                states[int(r["id"])] = await self._keys(owner).open(
                    str(r["state_payload"]).encode(),
                    state_ad(owner, int(r["id"]), include_state_key),
                )
        token = str(items[-1].conversation_id) if len(rows) > page_size else ""
        return ConversationSearch(Page(items, token), total, states)

    async def purge_expired(self, *, batch_size: int = 500) -> DeleteCounts:
        return await delete_selected(self, lsql.SELECT_EXPIRED_CONVERSATIONS, {}, batch_size)

    async def erase_user(self, *, user_id: str, settings: EraseSettings) -> ErasureReceipt:
        (begun,) = await self._rows(
            lsql.ERASE_BEGIN,
            {
                "user_id": user_id,
                "user_hash": d.user_hash(user_id),
                "stale_ms": int(settings.stale_seconds * 1000),
            },
        )
        erasure_id = int(begun["erasure_id"])
        if begun["already_done"]:
            return await self.get_erasure_receipt(erasure_id=erasure_id)
        # The data key's id, read before the last batch deletes its row (no new key is
        # made while the erase runs: the fence): the KMS is told after (crypto-shredding).
        key_rows = await self._rows(SELECT_USER_KEY, {"user_id": user_id})
        # Running turns were asked to stop: give them a moment to end cleanly. One still
        # running after that is erased anyway; its next write is NOT_FOUND.
        deadline = time.monotonic() + settings.stop_grace_seconds
        while time.monotonic() < deadline:
            (row,) = await self._rows(lsql.COUNT_RUNNING_TURNS, {"user_id": user_id})
            if not row["running"]:
                break
            await asyncio.sleep(0.05)
        pace = ErasePace(settings)
        while True:
            (row,) = await self._rows(
                lsql.ERASE_BATCH,
                {"user_id": user_id, "erasure_id": erasure_id, "batch": pace.conversations},
            )
            if not row["remaining"]:
                pace.finished(float(row["seconds"]))  # the last: scoped state, receipt
                break
            pause = pace.after(json.loads(row["batch_counts"]), float(row["seconds"]))
            if pause > 0:
                await asyncio.sleep(pause)
        log.info(
            "erasure %d: %d batches, %.3f s in them, %.3f s resting between them",
            erasure_id,
            pace.batches,
            pace.busy_seconds,
            pace.rest_seconds,
        )
        self.encryption.cache.drop(user_id)
        if key_rows and self.encryption.kms is not None:
            self.encryption.kms.destroy(key_id=bytes(key_rows[0]["key_id"]))
        return await self.get_erasure_receipt(erasure_id=erasure_id)

    async def get_erasure_receipt(self, *, erasure_id: int) -> ErasureReceipt:
        rows = await self._rows(lsql.SELECT_ERASURE, {"erasure_id": erasure_id})
        if not rows:
            raise d.erasure_not_found(erasure_id)
        return receipt_of(rows[0])
