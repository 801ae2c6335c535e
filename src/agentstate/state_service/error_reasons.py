"""The state service's errors as google.rpc.ErrorInfo: the reason is the error class's
own (domain.errors); the metadata comes from the error's fields.

The mechanism (building and reading the status detail) is agentstate.common.error_details.
agentstate.client maps these reasons back to exceptions, so a reason, once sent, is part of
the contract.
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
)
from agentstate.state_service import domain as d


def state_error_detail(error: d.StateServiceError) -> ErrorDetail:
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
    return ErrorDetail(error.reason, metadata)
