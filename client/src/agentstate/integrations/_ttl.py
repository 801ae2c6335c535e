"""A conversation's time to live as the adapters take it: seconds, and whether each write
renews it (the state service's RENEW_ON_WRITE policy) or it is fixed from creation.

Checked here for type and sign, so a bad value is the framework's ValueError at the call
that took it; the upper bound (ten years) is the service's, whose INVALID_ARGUMENT each
adapter turns into a ValueError too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeToLive:
    seconds: int
    renewed_by_writes: bool = False


def time_to_live(
    seconds: object, renewed_by_writes: object = False, *, what: str = "ttl_seconds"
) -> TimeToLive | None:
    """The time to live that `seconds` (None: none) and the policy describe."""
    if not isinstance(renewed_by_writes, bool):
        raise ValueError(f"ttl_renewed_by_writes must be a bool, got {renewed_by_writes!r}")
    if seconds is None:
        if renewed_by_writes:
            raise ValueError(f"ttl_renewed_by_writes needs {what}")
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
        raise ValueError(f"{what} must be a positive whole number of seconds, got {seconds!r}")
    return TimeToLive(seconds, renewed_by_writes)
