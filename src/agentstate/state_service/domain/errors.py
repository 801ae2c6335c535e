"""The state service's errors: one class per reason a caller can act on.

Each class carries its ErrorInfo reason, part of the contract (docs/reference/errors.md,
checked by tests/contract/test_error_reasons.py); the servicer picks the status code by
class and builds the metadata from the error's fields. A subclass without a reason of its
own keeps its parent's.
"""

from __future__ import annotations

from typing import ClassVar


class StateServiceError(Exception):
    """Base class: every error a caller can act on."""

    reason: ClassVar[str] = "STORE_ERROR"


class InvalidArgument(StateServiceError):
    reason: ClassVar[str] = "INVALID_ARGUMENT"


class NotFound(StateServiceError):
    """`missing` says what is absent: "conversation", "state", "message" or "task"."""

    reason: ClassVar[str] = "NOT_FOUND"

    def __init__(self, message: str, missing: str = "conversation") -> None:
        super().__init__(message)
        self.missing = missing


class VersionConflict(StateServiceError):
    """Compare-and-set failed; `current_version` is 0 when no state exists."""

    reason: ClassVar[str] = "VERSION_CONFLICT"

    def __init__(self, expected: int, current_version: int) -> None:
        self.expected = expected
        self.current_version = current_version
        current = (
            "no state exists" if current_version == 0 else f"current version is {current_version}"
        )
        super().__init__(f"version conflict: expected version {expected}, {current}")


class ResourceExhausted(StateServiceError):
    """A size or count limit was reached."""

    reason: ClassVar[str] = "LIMIT_REACHED"


class PayloadTooLarge(ResourceExhausted):
    reason: ClassVar[str] = "PAYLOAD_TOO_LARGE"


class FailedPrecondition(StateServiceError):
    reason: ClassVar[str] = "FAILED_PRECONDITION"


class AlreadyExists(StateServiceError):
    """A conversation of this user already has the requested external key."""

    reason: ClassVar[str] = "ALREADY_EXISTS"


class PermissionDenied(StateServiceError):
    """The state service's policy does not let this caller make this call, or the call
    uses an operator's ability the service does not allow (listing across users)."""

    reason: ClassVar[str] = "PERMISSION_DENIED"


class CallerUnauthenticated(StateServiceError):
    """The caller did not prove who it is (no client certificate or service token where
    the policy needs one, or a token that is not valid)."""

    reason: ClassVar[str] = "CALLER_UNAUTHENTICATED"


class StoreError(StateServiceError):
    """The database failed the operation for a reason the caller cannot fix."""

    reason: ClassVar[str] = "STORE_ERROR"


class StoreUnavailable(StateServiceError):
    """The database could not be reached; the call may be retried."""

    reason: ClassVar[str] = "STORE_UNAVAILABLE"


class LeaseHeld(FailedPrecondition):
    """Another turn holds the conversation's unexpired run lease. Which replica holds
    it is for operators (ErrorInfo metadata `holder`), not for the message."""

    reason: ClassVar[str] = "LEASE_HELD"

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


class LeaseLost(FailedPrecondition):
    """The caller's lease was released or taken over by another turn."""

    reason: ClassVar[str] = "LEASE_LOST"


class CardPending(FailedPrecondition):
    """A record of the conversation awaits confirmation; `message_id` names it."""

    reason: ClassVar[str] = "CARD_PENDING"

    def __init__(self, message_id: int) -> None:
        super().__init__(
            f"confirmation card {message_id} is still pending: answer it before "
            "starting another turn"
        )
        self.message_id = message_id


class MessageStatusMismatch(FailedPrecondition):
    """A message write's `expected_status` did not match the record's status."""

    reason: ClassVar[str] = "MESSAGE_STATUS_MISMATCH"


class CardAlreadyHandled(FailedPrecondition):
    """BeginTurn's `require_awaiting_message_id` names a card that no longer awaits."""

    reason: ClassVar[str] = "CARD_ALREADY_HANDLED"


class ContextNotArray(FailedPrecondition):
    """A delta cannot apply: the stored state's "context" is not an array."""

    reason: ClassVar[str] = "CONTEXT_NOT_ARRAY"


class TargetHasCheckpoints(FailedPrecondition):
    """CopyCheckpoints into a conversation that has checkpoints."""

    reason: ClassVar[str] = "TARGET_HAS_CHECKPOINTS"


class CheckpointNotStored(FailedPrecondition):
    """PutCheckpointWrites for a checkpoint that is not stored: pending writes always
    belong to a stored checkpoint, so a refused or lost put never leaves writes behind."""

    reason: ClassVar[str] = "CHECKPOINT_NOT_STORED"


class NotSupported(StateServiceError):
    """The store lacks the capability an RPC needs (storage.base.Feature)."""

    reason: ClassVar[str] = "NOT_SUPPORTED"


class CheckpointConflict(StateServiceError):
    """A checkpoint put's compare-and-set on its namespace's head failed;
    `current` is the head now ("" when the namespace holds none)."""

    reason: ClassVar[str] = "CHECKPOINT_CONFLICT"

    def __init__(self, namespace: str, expected: str, current: str) -> None:
        self.namespace = namespace
        self.expected = expected
        self.current = current
        want = f"checkpoint {expected}" if expected else "no checkpoint"
        now = f"checkpoint {current}" if current else "no checkpoint"
        super().__init__(
            f"checkpoint conflict in namespace {namespace!r}: expected the head to be "
            f"{want}, it is {now} (another writer extended this history); nothing was stored"
        )


class RevisionConflict(VersionConflict):
    """Compare-and-set on a conversation's item revision failed."""

    def __init__(self, expected: int, current_revision: int) -> None:
        super().__init__(expected, current_revision)
        self.args = (
            f"revision conflict: expected item revision {expected}, "
            f"current revision is {current_revision}",
        )


def conversation_not_found(conversation_id: int, *, nothing_deleted: bool = False) -> NotFound:
    tail = "; nothing was deleted" if nothing_deleted else ""
    return NotFound(f"conversation {conversation_id} not found{tail}")


def message_not_found(message_id: int, conversation_id: int, where: str = "") -> NotFound:
    prefix = f"{where}: " if where else ""
    return NotFound(
        f"{prefix}message {message_id} not found in conversation {conversation_id}", "message"
    )


def status_mismatch(
    where: str, message_id: int, status: str, expected: str
) -> MessageStatusMismatch:
    return MessageStatusMismatch(
        f"{where}: message {message_id} has status {status}, expected {expected}"
    )


def not_awaiting(message_id: int, status: str) -> CardAlreadyHandled:
    return CardAlreadyHandled(
        f"confirmation card {message_id} was already handled "
        f"(its record's status is {status}, not AWAITING_CONFIRM)"
    )


def user_lease_limit(running: int, limit: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"user already has {running} running turns (limit {limit}); retry when one finishes"
    )


def delta_out_of_range(field: str, value: int, length: int) -> InvalidArgument:
    return InvalidArgument(
        f"delta.{field} is {value} but the stored context has {length} messages"
        f"{' after drop_head' if field == 'replace_from' else ''}; nothing was stored"
    )


def context_not_array() -> ContextNotArray:
    return ContextNotArray(
        'the stored state\'s "context" is not an array, so a delta cannot apply to it: '
        "send the whole state"
    )


def fields_name_context() -> InvalidArgument:
    return InvalidArgument(
        'delta.fields_json must not name "context" (messages travel in delta.messages)'
    )


def state_too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the state after this delta would be {size} bytes, over the limit of {limit} bytes; "
        "nothing was stored"
    )


def lease_taken_over(task_id: int, holder_task_id: int) -> LeaseLost:
    return LeaseLost(
        f"the run lease of task {task_id} lapsed and task {holder_task_id} took it over; "
        "this turn's save was refused"
    )


def external_key_taken(key: str) -> AlreadyExists:
    return AlreadyExists(f"another conversation of this user already has external_key {key!r}")


def external_key_not_found(key: str) -> NotFound:
    return NotFound(f"no conversation of this user has external_key {key!r}")


def target_has_checkpoints(conversation_id: int) -> TargetHasCheckpoints:
    return TargetHasCheckpoints(
        f"conversation {conversation_id} already has checkpoints: "
        "a copy never merges two histories; nothing was copied"
    )


def checkpoint_not_stored(namespace: str, checkpoint_id: str) -> CheckpointNotStored:
    return CheckpointNotStored(
        f"checkpoint {checkpoint_id!r} (namespace {namespace!r}) is not stored: pending "
        "writes need their checkpoint stored first; nothing was stored"
    )


def not_supported(feature: str, store: str) -> NotSupported:
    return NotSupported(
        f"this state service's store ({store}) does not keep {feature}; nothing was changed: "
        "run it on a store that does (PostgreSQL keeps everything)"
    )


def state_not_mergeable(state_key: str) -> FailedPrecondition:
    return FailedPrecondition(
        f'state {state_key!r} holds an agent state (its "context" is an array): AppendEvent '
        "merges a state delta only into a state without one; nothing was stored"
    )


# ------------------------------------------------------------ encryption at rest


class EncryptionKeyUnavailable(FailedPrecondition):
    """Stored data needs a key this service does not have: the user's data key is
    wrapped by a key-encryption key missing from STATE_ENCRYPTION_KEY_FILE, or the row
    is sealed and STATE_ENCRYPTION is off. Nothing was changed."""

    reason: ClassVar[str] = "ENCRYPTION_KEY_UNAVAILABLE"


class CiphertextRejected(StateServiceError):
    """Stored data that cannot be read (DATA_LOSS): a ciphertext that does not
    authenticate for its row (altered, or moved from another row)."""

    reason: ClassVar[str] = "CIPHERTEXT_REJECTED"


class DataKeyDestroyed(CiphertextRejected):
    """The data was sealed with a data key destroyed when its user was erased."""

    reason: ClassVar[str] = "DATA_KEY_DESTROYED"
