"""Typed exceptions for failed state service calls.

Every error status the state service sends carries a google.rpc.ErrorInfo (domain
"agentstate.io", a reason and metadata; see agentstate.client.error_details). A failed call
becomes the exception for its reason, else for its status code, else StateError itself.
Statuses made by gRPC itself (deadline, connection) carry no ErrorInfo: `reason` is "".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import grpc

from agentstate.client.error_details import (
    AWAITING_MESSAGE_ID,
    CURRENT_CHECKPOINT_ID,
    CURRENT_VERSION,
    EXPECTED_VERSION,
    MISSING,
    error_info,
)

# The older trailers, read when a status has no ErrorInfo.
_TRAILERS = {
    "agentstate-current-version": CURRENT_VERSION,
    "agentstate-missing": MISSING,
    "agentstate-awaiting-message": AWAITING_MESSAGE_ID,
}


class StateError(Exception):
    """A failed state service call: its gRPC status `code`, the ErrorInfo `reason` ("" when
    the status had none) and `metadata`, and the server's `message`."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({self.message!r}, code={self.code.name}, reason={self.reason!r})"


class InvalidArgument(StateError):
    """INVALID_ARGUMENT: the request is malformed (reasons INVALID_ARGUMENT, MALFORMED_REQUEST)."""


class NotFound(StateError):
    """NOT_FOUND: `missing` says what: "conversation", "state", "message" or "task"."""

    @property
    def missing(self) -> str:
        return self.metadata.get(MISSING, "")


class AlreadyExists(StateError):
    """ALREADY_EXISTS: the external key is another conversation's."""


class VersionConflict(StateError):
    """ABORTED: compare-and-set failed. `current_version` is the stored version (0: none)."""

    @property
    def current_version(self) -> int:
        return int(self.metadata.get(CURRENT_VERSION) or 0)

    @property
    def expected_version(self) -> int | None:
        value = self.metadata.get(EXPECTED_VERSION)
        return int(value) if value else None


class CheckpointConflict(VersionConflict):
    """ABORTED, reason CHECKPOINT_CONFLICT: another writer extended the checkpoint history
    first (put_checkpoint's expected_head); `current_checkpoint_id` is the head now ("":
    none). Nothing was stored."""

    @property
    def current_checkpoint_id(self) -> str:
        return self.metadata.get(CURRENT_CHECKPOINT_ID, "")


class FailedPrecondition(StateError):
    """FAILED_PRECONDITION: the conversation is not in a state that allows the call."""


class LeaseHeld(FailedPrecondition):
    """Another turn holds the conversation's unexpired run lease."""


class LeaseLost(FailedPrecondition):
    """The caller's lease was released, or lapsed and was taken over: do not write."""


class CardPending(FailedPrecondition):
    """A record awaits confirmation (`awaiting_message_id`): answer it first."""

    @property
    def awaiting_message_id(self) -> str:
        return self.metadata.get(AWAITING_MESSAGE_ID, "")


class CardAlreadyHandled(FailedPrecondition):
    """BeginTurn's require_awaiting_message_id names a record no longer awaiting."""


class MessageStatusMismatch(FailedPrecondition):
    """A record write's expected_status did not match the stored status."""


class ContextNotArray(FailedPrecondition):
    """A delta save on a state whose "context" is not an array: send the whole state."""


class ErasureRunning(FailedPrecondition):
    """erase_user while another call's erase of the same user is alive."""


class UserBeingErased(FailedPrecondition):
    """A write that would add a row for a user whose erase runs: retry after it."""


class NotSupported(StateError):
    """UNIMPLEMENTED: the service's store does not keep what this call needs (for example
    checkpoints or items on a store without that capability)."""


class CheckpointNotStored(FailedPrecondition):
    """put_checkpoint_writes for a checkpoint that is not stored; nothing was stored."""


class TargetHasCheckpoints(FailedPrecondition):
    """copy_checkpoints into a conversation that has checkpoints (a copy never merges)."""


class ResourceExhausted(StateError):
    """RESOURCE_EXHAUSTED: a size or count limit."""


class PayloadTooLarge(ResourceExhausted):
    """The state is larger than the service accepts (STATE_MAX_PAYLOAD_BYTES)."""


class LimitReached(ResourceExhausted):
    """The user holds as many running turns (leases) as allowed."""


class Unavailable(StateError):
    """UNAVAILABLE: the service or its database is unreachable; retrying may succeed."""


class DeadlineExceeded(StateError):
    """DEADLINE_EXCEEDED: no answer within the call's deadline (it may still have applied)."""


class PermissionDenied(StateError):
    """PERMISSION_DENIED: the state service's policy does not let this caller make this
    call, or the call uses an operator's ability the service does not allow (listing
    across users, STATE_ALLOW_LIST_ALL_USERS); nothing was changed (docs/security.md)."""


class Unauthenticated(StateError):
    """UNAUTHENTICATED: the state service needs the caller to identify itself (a client
    certificate or a service token), or refused the token sent."""


class InternalError(StateError):
    """INTERNAL, UNKNOWN and any other status: nothing the caller can fix."""


_BY_REASON: dict[str, type[StateError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "MALFORMED_REQUEST": InvalidArgument,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "VERSION_CONFLICT": VersionConflict,
    "CHECKPOINT_CONFLICT": CheckpointConflict,
    "TARGET_HAS_CHECKPOINTS": TargetHasCheckpoints,
    "CHECKPOINT_NOT_STORED": CheckpointNotStored,
    "LEASE_HELD": LeaseHeld,
    "LEASE_LOST": LeaseLost,
    "CARD_PENDING": CardPending,
    "CARD_ALREADY_HANDLED": CardAlreadyHandled,
    "MESSAGE_STATUS_MISMATCH": MessageStatusMismatch,
    "CONTEXT_NOT_ARRAY": ContextNotArray,
    "ERASURE_RUNNING": ErasureRunning,
    "USER_BEING_ERASED": UserBeingErased,
    "NOT_SUPPORTED": NotSupported,
    "FAILED_PRECONDITION": FailedPrecondition,
    "PAYLOAD_TOO_LARGE": PayloadTooLarge,
    "LIMIT_REACHED": LimitReached,
    "STORE_UNAVAILABLE": Unavailable,
    "STORE_ERROR": InternalError,
    "PERMISSION_DENIED": PermissionDenied,
    "CALLER_UNAUTHENTICATED": Unauthenticated,
}
_BY_CODE: dict[grpc.StatusCode, type[StateError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.ABORTED: VersionConflict,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNIMPLEMENTED: NotSupported,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def _trailers(error: grpc.RpcError) -> dict[str, str]:
    call = cast(grpc.Call, error)
    pairs = cast(Iterable[tuple[str, str | bytes]], call.trailing_metadata() or ())
    found: dict[str, str] = {}
    for key, value in pairs:
        if key in _TRAILERS:
            found[_TRAILERS[key]] = value if isinstance(value, str) else value.decode()
    return found


def from_rpc_error(error: grpc.RpcError) -> StateError:
    """The typed exception for a failed call (sync grpc.RpcError or grpc.aio.AioRpcError):
    by ErrorInfo reason first, then by status code."""
    call = cast(grpc.Call, error)
    code = call.code()
    message = call.details() or code.name
    info = error_info(error)
    reason = info.reason if info is not None else ""
    metadata = dict(info.metadata) if info is not None else _trailers(error)
    kind = _BY_REASON.get(reason) or _BY_CODE.get(code, InternalError)
    # A reason the code does not agree with (a future reason under a known code) keeps
    # the code's class.
    if reason and reason not in _BY_REASON:
        kind = _BY_CODE.get(code, InternalError)
    return kind(message, code=code, reason=reason, metadata=metadata)
