"""The functions' refusals (SQLSTATE AS000 with a JSON detail) as domain errors, and the
error path's search for the payload PostgreSQL refused."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    InvalidArgument,
    Lease,
    MessageWrite,
    NotFound,
    StoreError,
    VersionConflict,
)

REFUSAL_SQLSTATE = "AS000"  # raised by agentstate_refuse() in migrations.py


def check_write_json(write: MessageWrite, where: str) -> None:
    """InvalidArgument if this write holds JSON that PostgreSQL refuses."""
    for field, data, kind in (
        ("blocks_json", write.blocks_json, list),
        ("metadata_json", write.metadata_json, dict),
    ):
        if data is not None:
            d.check_jsonb(data, kind, f"{where}.{field}")


def where_in_batch(index: Any, batch: str | None) -> str:
    """How an error names the write it is about: "message" or "message_writes[2]"."""
    return "message" if batch is None else f"{batch}[{index}]"


def refusal(detail: dict[str, Any], batch: str | None) -> d.StateServiceError:
    """The domain error for one of the functions' refusals (see migrations.py)."""
    kind = detail.get("kind")
    if kind == "not_found":
        if detail.get("missing") == "message":
            where = where_in_batch(detail["index"], batch) if "index" in detail else ""
            return d.message_not_found(
                int(detail["message_id"]), int(detail["conversation_id"]), where
            )
        if detail.get("nothing_pruned"):
            return NotFound(
                f"conversation {detail['conversation_id']} not found; nothing was pruned"
            )
        return d.conversation_not_found(
            int(detail["conversation_id"]), nothing_deleted=bool(detail.get("nothing_deleted"))
        )
    if kind == "too_deep":
        return d.too_deep("payload", int(detail["limit"]))
    if kind == "delta_range":
        return d.delta_out_of_range(
            str(detail["field"]), int(detail["value"]), int(detail["length"])
        )
    if kind == "context_not_array":
        return d.context_not_array()
    if kind == "not_mergeable":
        return d.state_not_mergeable(str(detail["state_key"]))
    if kind == "fields_not_object":
        return InvalidArgument("delta.fields_json must be a JSON object")
    if kind == "fields_name_context":
        return d.fields_name_context()
    if kind == "too_large":
        return d.state_too_large(int(detail["size"]), int(detail["limit"]))
    if kind == "revision_conflict":
        return d.RevisionConflict(int(detail["expected"]), int(detail["current"]))
    if kind == "version_conflict":
        return VersionConflict(int(detail["expected"]), int(detail["current"]))
    if kind == "status_mismatch":
        return d.status_mismatch(
            where_in_batch(detail["index"], batch),
            int(detail["message_id"]),
            str(detail["status"]),
            str(detail["expected"]),
        )
    if kind == "user_lease_limit":
        return d.user_lease_limit(int(detail["running"]), int(detail["limit"]))
    if kind == "lease_held":
        held = Lease(
            task_id=int(detail["task_id"]),
            conversation_id=int(detail["conversation_id"]),
            user_id="",
            holder=str(detail["holder"]),
            expire_time=datetime.fromisoformat(detail["expire_time"]),
            stop_requested=False,
        )
        return d.lease_held(held)
    if kind == "lease_lost":
        return d.lease_taken_over(int(detail["task_id"]), int(detail["holder_task_id"]))
    if kind == "lease_gone":
        task = int(detail["task_id"])
        return d.LeaseLost(f"lease of task {task} was lost (released or taken over)")
    if kind == "checkpoint_conflict":
        return d.CheckpointConflict(
            str(detail["namespace"]), str(detail["expected"]), str(detail["current"])
        )
    if kind == "checkpoint_not_stored":
        return d.checkpoint_not_stored(str(detail["namespace"]), str(detail["checkpoint_id"]))
    if kind == "target_has_checkpoints":
        return d.target_has_checkpoints(int(detail["conversation_id"]))
    if kind == "card_pending":
        return d.CardPending(int(detail["message_id"]))
    if kind == "not_awaiting":
        return d.not_awaiting(int(detail["message_id"]), str(detail["status"]))
    if kind == "user_being_erased":
        return d.user_being_erased(int(detail["erasure_id"]))
    if kind == "erasure_running":
        return d.erasure_running(int(detail["erasure_id"]))
    if kind == "unknown_user":
        return d.unknown_user()
    return StoreError(f"unexpected refusal from the database: {detail}")
