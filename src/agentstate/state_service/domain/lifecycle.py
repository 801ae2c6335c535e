"""Data lifecycle: labels and their selectors, time to live, status, listing filters,
and the erasure of a user with its receipt (issue 23)."""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from agentstate.state_service.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from agentstate.state_service.domain.rules import check_no_nul

MAX_LABELS = 64
# include_total counts at most this many matches (a count is then bounded, as a page is);
# past it, ListConversations says MAX_COUNTED_TOTAL + 1: "more than MAX_COUNTED_TOTAL".
MAX_COUNTED_TOTAL = 10_000
MAX_LABEL_NAME_CHARS = 63
MAX_LABEL_PREFIX_CHARS = 253
MAX_LABEL_SELECTOR_CHARS = 4096
MAX_TTL_SECONDS = 10 * 365 * 24 * 3600
MAX_KEY_PREFIX_CHARS = 256

# Kubernetes' label syntax: a name (and a value, which may also be empty) is at most 63
# characters of [A-Za-z0-9._-], beginning and ending alphanumeric.
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_DNS_PREFIX = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")

# The kinds of rows an erasure counts, in the receipt's order.
ERASED_KINDS = (
    "conversations",
    "messages",
    "states",
    "state_messages",
    "leases",
    "compactions",
    "checkpoints",
    "checkpoint_writes",
    "channel_values",
    "items",
    "scoped_states",
)


class ConversationStatus(enum.StrEnum):
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    AWAITING_CONFIRMATION = "AWAITING_CONFIRMATION"
    FAILED = "FAILED"


class TtlPolicy(enum.StrEnum):
    FIXED = "FIXED"
    RENEW_ON_WRITE = "RENEW_ON_WRITE"


@dataclass(frozen=True)
class TimeToLive:
    seconds: int
    policy: TtlPolicy = TtlPolicy.FIXED


@dataclass(frozen=True)
class LabelSelector:
    """A parsed selector: every clause must hold."""

    equal: Mapping[str, str] = field(default_factory=dict)
    not_equal: Mapping[str, str] = field(default_factory=dict)
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (
            all(labels.get(k) == v for k, v in self.equal.items())
            and all(labels.get(k) != v for k, v in self.not_equal.items())
            and all(k in labels for k in self.present)
            and not any(k in labels for k in self.absent)
        )


@dataclass(frozen=True)
class ConversationFilter:
    """ListConversations' filters; None/empty: not applied. `user_id` None: every user."""

    user_id: str | None
    key_prefix: str = ""
    selector: LabelSelector = field(default_factory=LabelSelector)
    statuses: frozenset[ConversationStatus] = frozenset()
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    title_prefix: str = ""


@dataclass(frozen=True)
class LabelChange:
    set_labels: Mapping[str, str] = field(default_factory=dict)
    remove_labels: Sequence[str] = ()


@dataclass(frozen=True)
class ErasureReceipt:
    erasure_id: int
    done: bool
    counts: Mapping[str, int]
    start_time: datetime
    end_time: datetime | None


def validate_label_key(key: str, where: str = "label") -> str:
    check_no_nul(key, where)
    prefix, slash, name = key.rpartition("/")
    if slash and (
        not prefix or len(prefix) > MAX_LABEL_PREFIX_CHARS or not _DNS_PREFIX.match(prefix)
    ):
        raise InvalidArgument(
            f"{where} key {key[:80]!r}: its prefix must be a DNS subdomain of at most "
            f"{MAX_LABEL_PREFIX_CHARS} characters (lower case, digits, '-' and '.')"
        )
    if len(name) > MAX_LABEL_NAME_CHARS:
        raise InvalidArgument(
            f"{where} key {key[:80]!r} is too long: its name is at most "
            f"{MAX_LABEL_NAME_CHARS} characters"
        )
    if not _NAME.match(name):
        raise InvalidArgument(
            f"{where} key {key[:80]!r} is malformed: 1..{MAX_LABEL_NAME_CHARS} characters of "
            "[A-Za-z0-9._-], beginning and ending with a letter or digit"
        )
    return key


def validate_label_value(key: str, value: str, where: str = "label") -> str:
    check_no_nul(value, where)
    if len(value) > MAX_LABEL_NAME_CHARS:
        raise InvalidArgument(
            f"{where} {key!r}: the value is too long ({len(value)} characters, at most "
            f"{MAX_LABEL_NAME_CHARS})"
        )
    if value and not _NAME.match(value):
        raise InvalidArgument(
            f"{where} {key!r}: the value {value[:80]!r} is malformed: empty, or characters "
            "of [A-Za-z0-9._-] beginning and ending with a letter or digit"
        )
    return value


def validate_labels(labels: Mapping[str, str], where: str = "labels") -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(f"{where}: at most {MAX_LABELS} labels, got {len(labels)}")
    return {
        validate_label_key(k, where): validate_label_value(k, v, where)
        for k, v in sorted(labels.items())
    }


def apply_label_change(labels: Mapping[str, str], change: LabelChange) -> dict[str, str]:
    """The labels after a change; InvalidArgument when there would be too many."""
    result = {k: v for k, v in labels.items() if k not in set(change.remove_labels)}
    result.update(change.set_labels)
    if len(result) > MAX_LABELS:
        raise InvalidArgument(f"a conversation has at most {MAX_LABELS} labels")
    return result


def parse_label_selector(text: str) -> LabelSelector:
    """Kubernetes' equality-based selector: `a=b,c==d,e!=f,g,!h`."""
    if len(text) > MAX_LABEL_SELECTOR_CHARS:
        raise InvalidArgument(f"label_selector is over {MAX_LABEL_SELECTOR_CHARS} characters")
    check_no_nul(text, "label_selector")
    equal: dict[str, str] = {}
    not_equal: dict[str, str] = {}
    present: list[str] = []
    absent: list[str] = []
    if not text.strip():
        return LabelSelector()
    for index, raw in enumerate(text.split(",")):
        clause = raw.strip()
        where = f"label_selector clause {index + 1} ({clause[:80]!r})"
        if not clause:
            raise InvalidArgument(f"label_selector has an empty clause at position {index + 1}")
        try:
            if "!=" in clause:
                key, value = (part.strip() for part in clause.split("!=", 1))
                not_equal[validate_label_key(key, where)] = validate_label_value(key, value, where)
            elif "=" in clause:
                key, value = (
                    part.strip() for part in clause.split("==" if "==" in clause else "=", 1)
                )
                if key in equal and equal[key] != value:
                    raise InvalidArgument(f"{where}: {key!r} cannot equal two values")
                equal[validate_label_key(key, where)] = validate_label_value(key, value, where)
            elif clause.startswith("!"):
                absent.append(validate_label_key(clause[1:].strip(), where))
            else:
                present.append(validate_label_key(clause, where))
        except InvalidArgument as exc:  # one message that says how to write it
            raise InvalidArgument(
                f"label_selector does not parse: {exc}; write clauses like "
                "'team=shop,tier!=free,beta,!archived'"
            ) from None
    return LabelSelector(equal, not_equal, tuple(present), tuple(absent))


def validate_ttl(seconds: int, policy: TtlPolicy) -> TimeToLive:
    if seconds <= 0 or seconds > MAX_TTL_SECONDS:
        raise InvalidArgument(
            f"ttl.seconds must be 1..{MAX_TTL_SECONDS} (ten years), got {seconds}"
        )
    return TimeToLive(seconds, policy)


def validate_key_prefix(prefix: str) -> str:
    if len(prefix) > MAX_KEY_PREFIX_CHARS:
        raise InvalidArgument(f"key_prefix is over {MAX_KEY_PREFIX_CHARS} characters")
    return check_no_nul(prefix, "key_prefix")


class ErasureRunning(FailedPrecondition):
    """An erase of this user is under way in another call."""

    reason: ClassVar[str] = "ERASURE_RUNNING"


class UserBeingErased(FailedPrecondition):
    """A write for a user whose erase is under way."""

    reason: ClassVar[str] = "USER_BEING_ERASED"


def erasure_running(erasure_id: int) -> ErasureRunning:
    return ErasureRunning(
        f"an erase of this user is already running (receipt {erasure_id}); wait for it, "
        "or fetch the receipt with GetErasureReceipt"
    )


def user_being_erased(erasure_id: int) -> UserBeingErased:
    return UserBeingErased(
        f"this user's data is being erased (receipt {erasure_id}); nothing can be written "
        "for the user until the erase is done"
    )


def unknown_user() -> NotFound:
    return NotFound("this user has no data to erase and was never erased", missing="user")


def erasure_not_found(erasure_id: int) -> NotFound:
    return NotFound(f"no erasure has the id {erasure_id}", missing="erasure")


def user_hash(user_id: str) -> str:
    """How a receipt finds a later call for the same user without keeping the user id."""
    return hashlib.sha256(user_id.encode()).hexdigest()
