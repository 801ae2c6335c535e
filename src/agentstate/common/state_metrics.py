"""The state load/save instruments, shared by both sides of the gRPC hop.

Both services record into the same instrument names; the `side` attribute
("client" in the agent service, "server" in the state service) tells them apart.
"""

from __future__ import annotations

from agentstate.common.telemetry import meter

_meter = meter("agentstate.state")

LOAD_DURATION = _meter.create_histogram(
    "agentstate.state.load.duration", unit="s", description="Latency of loading a state"
)
SAVE_DURATION = _meter.create_histogram(
    "agentstate.state.save.duration", unit="s", description="Latency of saving a state"
)
PAYLOAD_SIZE = _meter.create_histogram(
    "agentstate.state.payload.size", unit="By", description="Size of a loaded or saved state"
)
VERSION_CONFLICTS = _meter.create_counter(
    "agentstate.state.version_conflicts",
    description="Compare-and-set saves refused because the state had changed",
)
PURGED = _meter.create_counter(
    "agentstate.retention.purged",
    description="Rows deleted by retention, by kind (conversations, messages, states)",
)
