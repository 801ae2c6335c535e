"""Standard error details for both services: google.rpc.Status with a google.rpc.ErrorInfo.

Every error status our servicers send carries, in the `grpc-status-details-bin` trailer, a
google.rpc.Status (same code and message) whose one detail is a google.rpc.ErrorInfo:
`domain` "agentstate.io", a stable UPPER_SNAKE `reason` and string `metadata`, for example
{"current_version": "7"} on an ABORTED save. A caller in any language reads it with its gRPC
library's status helpers (Java StatusProto.fromThrowable, Go status.Convert(err).Details(),
Python rpc_status.from_call) instead of parsing the message. The older trailers
(`agentstate-current-version`, `agentstate-missing`) are still sent beside it.

This module is the one mapping from each service's errors to reasons and metadata.
Statuses made by the gRPC library itself (deadline, cancellation, message too large,
UNIMPLEMENTED, an unexpected exception's UNKNOWN) carry no details.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from agentstate.agent_service import errors as agent_errors
from agentstate.state_service import domain as d

DOMAIN = "agentstate.io"

# ErrorInfo.metadata keys
CURRENT_VERSION = "current_version"  # ABORTED: the stored version ("0": no state)
EXPECTED_VERSION = "expected_version"  # ABORTED: the version the caller expected
MISSING = "missing"  # NOT_FOUND: "conversation", "state", "message" or "task"
AWAITING_MESSAGE_ID = "awaiting_message_id"  # CARD_PENDING: the open card's record id

# State service: reason by error class, the nearest class in the table winning (as the
# servicer picks the status code). A plain FailedPrecondition depends on the RPC (below).
_STATE_REASONS: dict[type[d.StateServiceError], str] = {
    d.InvalidArgument: "INVALID_ARGUMENT",
    d.NotFound: "NOT_FOUND",
    d.VersionConflict: "VERSION_CONFLICT",
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
}

# Agent service: reason by error class. When the error is a state-service status passed
# through with the same code, the state service's ErrorInfo is kept (say LEASE_HELD, or
# NOT_FOUND with "missing"), so callers see the precise reason behind the agent.
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


@dataclass(frozen=True)
class ErrorDetail:
    reason: str
    metadata: Mapping[str, str] = field(default_factory=dict)


def _nearest(table: Mapping[type[Any], str], error: Exception) -> str:
    for kind in type(error).__mro__:
        if kind in table:
            return table[kind]
    return "INTERNAL"


def state_error_detail(error: d.StateServiceError, rpc: str) -> ErrorDetail:
    reason = _nearest(_STATE_REASONS, error)
    if type(error) is d.FailedPrecondition:
        reason = _STATE_PRECONDITION_REASONS.get(rpc, reason)
    metadata: dict[str, str] = {}
    if isinstance(error, d.VersionConflict):
        metadata = {
            CURRENT_VERSION: str(error.current_version),
            EXPECTED_VERSION: str(error.expected),
        }
    elif isinstance(error, d.NotFound):
        metadata = {MISSING: error.missing}
    elif isinstance(error, d.CardPending):
        metadata = {AWAITING_MESSAGE_ID: str(error.message_id)}
    return ErrorDetail(reason, metadata)


def agent_error_detail(error: agent_errors.AgentError, code: grpc.StatusCode) -> ErrorDetail:
    cause = error.__cause__
    if isinstance(cause, grpc.aio.AioRpcError) and cause.code() == code:
        passed_through = error_info(cause)
        if passed_through is not None:
            return ErrorDetail(passed_through.reason, dict(passed_through.metadata))
    metadata: dict[str, str] = {}
    if isinstance(error, agent_errors.CardPending):
        metadata = {AWAITING_MESSAGE_ID: error.message_id}
    return ErrorDetail(_nearest(_AGENT_REASONS, error), metadata)


def rich_status(code: grpc.StatusCode, message: str, detail: ErrorDetail) -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(
        reason=detail.reason, domain=DOMAIN, metadata=dict(detail.metadata)
    )
    packed = any_pb2.Any()
    packed.Pack(info)
    number: int = code.value[0]
    return status_pb2.Status(code=number, message=message, details=[packed])


async def abort(
    context: grpc.aio.ServicerContext[Any, Any],
    code: grpc.StatusCode,
    message: str,
    detail: ErrorDetail,
    trailers: Iterable[tuple[str, str]] = (),
) -> NoReturn:
    """End the call with `code` and `message`, the details trailer and `trailers`."""
    status = rpc_status.to_status(rich_status(code, message, detail))
    # abort's trailing_metadata replaces any set earlier, so the extra trailers go with it.
    await context.abort(
        status.code, status.details, trailing_metadata=(*trailers, *status.trailing_metadata)
    )
    raise AssertionError("unreachable: abort raises")


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The agentstate ErrorInfo of a failed call (client side), or None without one."""
    # Failed calls are both RpcError and Call (sync) or AioRpcError, which has the same
    # code/details/trailing_metadata methods that from_call reads.
    try:
        status = rpc_status.from_call(cast(grpc.Call, error))
    except ValueError:  # details that do not match the call's status: not ours
        return None
    if status is None:
        return None
    for packed in status.details:
        info = error_details_pb2.ErrorInfo()
        if packed.Unpack(info) and info.domain == DOMAIN:
            return info
    return None
