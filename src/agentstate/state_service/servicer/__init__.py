"""StateService servicer: translates between protobuf and the domain, nothing more.

One module per aggregate, each a set of RPC handlers over the store; StateServicer is
their sum. translate.py holds what they share on the way out: each domain error's status
code, trailers and ErrorInfo.
"""

from __future__ import annotations

from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.servicer.checkpoints import CheckpointRpcs
from agentstate.state_service.servicer.conversations import ConversationRpcs
from agentstate.state_service.servicer.items import ItemRpcs
from agentstate.state_service.servicer.leases import LeaseRpcs
from agentstate.state_service.servicer.lifecycle import LifecycleRpcs
from agentstate.state_service.servicer.messages import MessageRpcs
from agentstate.state_service.servicer.states import StateRpcs
from agentstate.state_service.servicer.translate import (
    AWAITING_MESSAGE_TRAILER,
    CURRENT_VERSION_TRAILER,
    MISSING_TRAILER,
)

__all__ = [
    "AWAITING_MESSAGE_TRAILER",
    "CURRENT_VERSION_TRAILER",
    "MISSING_TRAILER",
    "StateServicer",
]


class StateServicer(
    ConversationRpcs,
    StateRpcs,
    MessageRpcs,
    LeaseRpcs,
    CheckpointRpcs,
    ItemRpcs,
    LifecycleRpcs,
    pb_grpc.StateServiceServicer,
):
    """Every StateService RPC; those of a capability the store lacks answer UNIMPLEMENTED."""
