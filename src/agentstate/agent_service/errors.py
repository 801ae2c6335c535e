"""Errors of the agent runtime, each one a thing a caller can act on.

The servicer maps them to gRPC status codes; the runtime knows nothing of gRPC.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base class. The message is what a caller reads: no endpoint, model, host or
    setting names. `metadata` (strings) goes into the status's google.rpc.ErrorInfo
    for operators, and `reason` replaces the class's ErrorInfo reason when set."""

    def __init__(
        self, message: str = "", *, reason: str = "", metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.metadata = dict(metadata or {})


class InvalidInput(AgentError):
    """The request is malformed (INVALID_ARGUMENT)."""


class Unauthenticated(AgentError):
    """No valid end-user identity came with the request (UNAUTHENTICATED); `reason` is
    the ErrorInfo reason (agent_service/auth.py: TOKEN_EXPIRED, ...)."""

    def __init__(self, message: str, reason: str = "UNAUTHENTICATED") -> None:
        super().__init__(message)
        self.reason = reason


class NotFound(AgentError):
    """The conversation, card or task does not exist for this user (NOT_FOUND)."""


class Conflict(AgentError):
    """The conversation is not in a state that allows this (FAILED_PRECONDITION):
    another turn is running, a card is pending, a card was already handled or expired."""


class CardPending(Conflict):
    """A confirmation card of the conversation is still open; `message_id` names it."""

    def __init__(self, message: str, message_id: str) -> None:
        super().__init__(message)
        self.message_id = message_id


class CardAlreadyHandled(Conflict):
    """The card a Confirm names no longer awaits an answer."""


class StateVersionConflict(AgentError):
    """The stored state changed under this turn; it was not overwritten (ABORTED)."""


class LimitReached(AgentError):
    """A size or concurrency limit was reached (RESOURCE_EXHAUSTED)."""


class Unavailable(AgentError):
    """A dependency (state service, model) or this replica is unavailable (UNAVAILABLE)."""


class InternalError(AgentError):
    """Something failed that the caller cannot fix (INTERNAL)."""
