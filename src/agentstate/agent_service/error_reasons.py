"""The agent service's errors as google.rpc.ErrorInfo reasons and metadata (the mechanism
is agentstate.common.error_details)."""

from __future__ import annotations

import grpc

from agentstate.agent_service import errors as agent_errors
from agentstate.client.errors import StateError
from agentstate.common.error_details import AWAITING_MESSAGE_ID, ErrorDetail, nearest_reason

# Reason by error class. When the error is a state-service status passed through with the
# same code, the state service's ErrorInfo is kept (say LEASE_HELD, or NOT_FOUND with
# "missing"), so callers see the precise reason behind the agent.
_AGENT_REASONS: dict[type[agent_errors.AgentError], str] = {
    agent_errors.InvalidInput: "INVALID_ARGUMENT",
    agent_errors.Unauthenticated: "UNAUTHENTICATED",
    agent_errors.NotFound: "NOT_FOUND",
    agent_errors.CardPending: "CARD_PENDING",
    agent_errors.Conflict: "CONFLICT",  # a card already handled or expired, a turn running
    agent_errors.StateVersionConflict: "VERSION_CONFLICT",
    agent_errors.LimitReached: "LIMIT_REACHED",
    agent_errors.Unavailable: "UNAVAILABLE",
    agent_errors.InternalError: "INTERNAL",
}


def agent_error_detail(error: agent_errors.AgentError, code: grpc.StatusCode) -> ErrorDetail:
    cause = error.__cause__
    if isinstance(cause, StateError) and cause.code == code and cause.reason:
        return ErrorDetail(cause.reason, {**cause.metadata, **error.metadata})
    metadata: dict[str, str] = dict(error.metadata)
    if isinstance(error, agent_errors.CardPending):
        metadata[AWAITING_MESSAGE_ID] = error.message_id
    return ErrorDetail(error.reason or nearest_reason(_AGENT_REASONS, error), metadata)
