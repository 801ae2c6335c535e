"""The agent service's own instruments (state load/save ones are in agentstate.common)."""

from __future__ import annotations

import hashlib

from agentstate.common.telemetry import meter

_meter = meter("agentstate.agent")

LEASE_CONFLICTS = _meter.create_counter(
    "agentstate.lease.conflicts",
    description="Turns refused because another turn held the conversation's lease",
)
CONFIRMATIONS = _meter.create_counter(
    "agentstate.confirmations",
    description="Confirmation cards settled, by decision (approved, denied, expired)",
)
CONTEXT_SECONDS = _meter.create_histogram(
    "agentstate.context.manage.duration",
    unit="s",
    description="Time spent trimming and compacting the context before a model call",
)
RUNNING_TURNS = _meter.create_up_down_counter(
    "agentstate.turns.running", description="Turns running in this replica"
)


def user_attribute(user_id: str, mode: str) -> str | None:
    """The end user as a span attribute: hashed (default), plain, or omitted."""
    if mode == "omit":
        return None
    if mode == "plain":
        return user_id
    return hashlib.sha256(user_id.encode()).hexdigest()[:16]
