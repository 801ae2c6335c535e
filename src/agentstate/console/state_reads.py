"""The console's read-only view of the state service: the one module that calls it.

The inspector shows what the agent keeps apart from the message records: the stored
AgentState (version, size, the context the model sees, the summary, the calls still
pending), the compaction audit trail and the run lease. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from agentstate.common.service_config import channel_options
from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc


@dataclass(frozen=True)
class Inspection:
    """What the inspector shows, as JSON-ready values."""

    state: dict[str, Any] | None  # None: the conversation has no state yet
    compactions: list[dict[str, Any]]
    lease: dict[str, Any] | None  # None: no turn holds it


def _iso(ts: Any) -> str | None:
    return ts.ToDatetime(tzinfo=UTC).isoformat() if ts.seconds or ts.nanos else None


def _block_summary(block: dict[str, Any]) -> str:
    kind = str(block.get("type", "?"))
    if kind in ("tool_use", "tool_result"):
        return f"{kind} {block.get('name', '')} ({block.get('state', '')})"
    return kind


def describe_state(payload: bytes, version: int, update_time: str | None) -> dict[str, Any]:
    """The parts of an AgentState a person looks at; the JSON codec's shape, read loosely
    (the console must not break on fields it does not know)."""
    data = json.loads(payload)
    context = data.get("context") or []
    results = {
        b.get("id")
        for m in context
        for b in m.get("content") or []
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }
    pending = [
        {"call_id": b.get("id"), "name": b.get("name"), "input": b.get("input")}
        for m in context
        for b in m.get("content") or []
        if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") not in results
    ]
    return {
        "version": version,
        "size_bytes": len(payload),
        "update_time": update_time,
        "summary": data.get("summary") or "",
        "messages": [
            {
                "role": m.get("role", "?"),
                "blocks": [
                    _block_summary(b) for b in m.get("content") or [] if isinstance(b, dict)
                ],
            }
            for m in context
        ],
        "pending_calls": pending,
    }


class StateReader:
    """Read-only calls to the state service, scoped to one user each."""

    def __init__(self, address: str, timeout: float) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=channel_options())
        self._stub: Any = spb_grpc.StateServiceStub(self._channel)
        self._timeout = timeout

    async def close(self) -> None:
        await self._channel.close(None)

    async def inspect(self, user_id: str, conversation_id: str) -> Inspection:
        """NOT_FOUND (as grpc.aio.AioRpcError) when the conversation is not the user's."""
        ids = {"user_id": user_id, "conversation_id": conversation_id}
        # The lease first: it says NOT_FOUND for a missing conversation, where GetState
        # cannot tell it from a conversation with no state yet without a trailer.
        lease = (await self._stub.GetLease(spb.GetLeaseRequest(**ids), timeout=self._timeout)).lease
        compactions = (
            await self._stub.ListCompactions(
                spb.ListCompactionsRequest(**ids), timeout=self._timeout
            )
        ).compactions
        try:
            stored = await self._stub.GetState(spb.GetStateRequest(**ids), timeout=self._timeout)
            state: dict[str, Any] | None = describe_state(
                stored.payload, stored.version, _iso(stored.update_time)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            state = None  # the conversation exists (GetLease said so): no state saved yet
        now = datetime.now(UTC)
        return Inspection(
            state=state,
            compactions=[
                {
                    "messages_before": c.messages_before,
                    "messages_after": c.messages_after,
                    "tokens_before": c.tokens_before,
                    "tokens_after": c.tokens_after,
                    "summary_chars": c.summary_chars,
                    "reason": c.reason,
                    "create_time": _iso(c.create_time),
                }
                for c in compactions
            ],
            lease=None
            if not lease.task_id
            else {
                "task_id": lease.task_id,
                "holder": lease.holder,
                "since": _iso(lease.acquire_time),
                "expires": _iso(lease.expire_time),
                "lapsed": lease.expire_time.ToDatetime(tzinfo=UTC) <= now,
                "stop_requested": lease.stop_requested,
            },
        )
