"""The state service's errors as google.rpc.ErrorInfo reasons and metadata.

The mechanism (building and reading the status detail) is agentstate.common.error_details;
this is the state service's own table. agentstate.client maps these reasons back to
exceptions, so a reason, once sent, is part of the contract.
"""

from __future__ import annotations

from agentstate.common.error_details import (
    AWAITING_MESSAGE_ID,
    CURRENT_CHECKPOINT_ID,
    CURRENT_VERSION,
    EXPECTED_CHECKPOINT_ID,
    EXPECTED_VERSION,
    HOLDER,
    MISSING,
    ErrorDetail,
    nearest_reason,
)
from agentstate.state_service import domain as d

# Reason by error class, the nearest class in the table winning (as the servicer picks
# the status code). A plain FailedPrecondition depends on the RPC (below).
_STATE_REASONS: dict[type[d.StateServiceError], str] = {
    d.InvalidArgument: "INVALID_ARGUMENT",
    d.NotFound: "NOT_FOUND",
    d.AlreadyExists: "ALREADY_EXISTS",  # an external_key another conversation has
    d.VersionConflict: "VERSION_CONFLICT",
    d.CheckpointConflict: "CHECKPOINT_CONFLICT",  # another writer extended the history
    d.PayloadTooLarge: "PAYLOAD_TOO_LARGE",
    d.ResourceExhausted: "LIMIT_REACHED",  # a user's concurrent leases
    d.LeaseHeld: "LEASE_HELD",  # another turn holds the conversation's lease
    d.LeaseLost: "LEASE_LOST",  # released, or taken over by another task (fenced)
    d.CardPending: "CARD_PENDING",  # a card awaits an answer
    d.FailedPrecondition: "FAILED_PRECONDITION",
    d.StoreUnavailable: "STORE_UNAVAILABLE",
    d.StoreError: "STORE_ERROR",
}
_STATE_PRECONDITION_REASONS: dict[str, str] = {
    "BeginTurn": "CARD_ALREADY_HANDLED",  # require_awaiting_message_id no longer awaits
    "UpsertState": "MESSAGE_STATUS_MISMATCH",  # a message write's expected_status
    "UpdateMessage": "MESSAGE_STATUS_MISMATCH",
    "EndTurn": "MESSAGE_STATUS_MISMATCH",
    "CopyCheckpoints": "TARGET_HAS_CHECKPOINTS",  # a copy never merges two histories
}


def state_error_detail(error: d.StateServiceError, rpc: str) -> ErrorDetail:
    reason = nearest_reason(_STATE_REASONS, error)
    if type(error) is d.FailedPrecondition:
        reason = _STATE_PRECONDITION_REASONS.get(rpc, reason)
    metadata: dict[str, str] = {}
    if isinstance(error, d.VersionConflict):
        metadata = {
            CURRENT_VERSION: str(error.current_version),
            EXPECTED_VERSION: str(error.expected),
        }
    elif isinstance(error, d.CheckpointConflict):
        metadata = {CURRENT_CHECKPOINT_ID: error.current, EXPECTED_CHECKPOINT_ID: error.expected}
    elif isinstance(error, d.NotFound):
        metadata = {MISSING: error.missing}
    elif isinstance(error, d.CardPending):
        metadata = {AWAITING_MESSAGE_ID: str(error.message_id)}
    elif isinstance(error, d.LeaseHeld) and error.holder:
        metadata = {HOLDER: error.holder}
    return ErrorDetail(reason, metadata)
