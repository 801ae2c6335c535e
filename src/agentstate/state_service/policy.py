"""Which caller may call which state RPC for which users: the one place that decides.

A policy file (STATE_POLICY_FILE, JSON) lists rules; a call is allowed when one rule
matches its caller, its RPC and its user, and denied otherwise (PERMISSION_DENIED):

    {"rules": [
      {"caller": "spiffe://cluster.local/ns/agentstate/sa/agentstate-agent",
       "rpcs": ["read", "write"], "users": ["*"]},
      {"caller": "reporting", "rpcs": ["read"]},
      {"caller": "operator", "rpcs": ["read", "write", "admin"]}
    ]}

- `caller`: the caller's identity (callers.py): the SPIFFE ID of its client certificate,
  else the certificate's common name, or the caller claim of its service token; "*" any
  identified caller (never an anonymous one).
- `rpcs`: RPC names (`GetState`) and the groups `read` (RPCs that change nothing),
  `write` (the other per-user RPCs) and `admin` (every RPC in neither list: the
  cross-user ones, such as erasing a user or listing across users; an RPC added later is
  admin until it is put in a list here, so a new RPC is never open by accident); "*" all.
- `users`: the user ids the rule covers: "*" (the default), an exact id, a prefix
  ending in "*" (`"tenant-a:*"`), or "self": the user whose id is the caller's own
  identity (a token issued to one end user reaches only that user's data). A cross-user
  call (user None) needs a rule with "*".

Without a policy every call is allowed (the sidecar: one caller, on loopback).

The caller interceptor (callers.py) checks every RPC before its handler runs, with the
request's `user_id` (empty or absent: a call across users, which needs a rule for "*").
A servicer that acts on users other than its request's `user_id` (a cross-user listing
that returns several users' data, say) calls `authorize(rpc, user_id)` for each, which
checks the current call's caller against the current policy.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agentstate.common.config import ConfigError
from agentstate.state_service.domain import PermissionDenied

READ_RPCS = frozenset(
    {
        "GetState",
        "GetConversation",
        "ListConversations",
        "ListMessages",
        "ListCompactions",
        "GetMessage",
        "GetCheckpoint",
        "ListCheckpoints",
        "ListItems",
        "GetScopedState",
        "GetLease",
    }
)
WRITE_RPCS = frozenset(
    {
        "UpsertState",
        "CreateConversation",
        "RenameConversation",
        "DeleteConversation",
        "BatchDeleteConversations",
        "AppendMessage",
        "UpdateMessage",
        "AcquireLease",
        "RenewLease",
        "ReleaseLease",
        "RequestStop",
        "BeginTurn",
        "EndTurn",
        "PutCheckpoint",
        "PutCheckpointWrites",
        "DeleteCheckpointsForRuns",
        "CopyCheckpoints",
        "PruneCheckpoints",
        "AppendItems",
        "PopItem",
        "ClearItems",
        "AppendEvent",
        "ResolveConversation",
        "UpdateConversation",
    }
)
# Erasing a user and reading erasure receipts (by receipt id, across users): operators'.
ADMIN_RPCS = frozenset({"EraseUser", "GetErasureReceipt"})
GROUPS = ("read", "write", "admin")


def group_of(rpc: str) -> str:
    """`read`, `write` or `admin` (anything not known to be per-user)."""
    if rpc in READ_RPCS:
        return "read"
    if rpc in WRITE_RPCS:
        return "write"
    return "admin"


@dataclass(frozen=True)
class Caller:
    """Who called: `name` ("" when anonymous), how it proved it (`mtls`, `token` or
    `none`) and its address (for the audit)."""

    name: str = ""
    via: str = "none"
    peer: str = ""

    @property
    def identified(self) -> bool:
        return bool(self.name)

    def shown(self) -> str:
        return f"{self.name} ({self.via})" if self.name else "an anonymous caller"


ANONYMOUS = Caller()
_current: contextvars.ContextVar[Caller] = contextvars.ContextVar("caller", default=ANONYMOUS)


def current_caller() -> Caller:
    """The caller of the RPC being served (set by callers.CallerInterceptor)."""
    return _current.get()


def set_current_caller(caller: Caller) -> contextvars.Token[Caller]:
    return _current.set(caller)


def reset_current_caller(token: contextvars.Token[Caller]) -> None:
    _current.reset(token)


_policy: contextvars.ContextVar[Policy | None] = contextvars.ContextVar("policy", default=None)


def set_current_policy(policy: Policy | None) -> contextvars.Token[Policy | None]:
    return _policy.set(policy)


def reset_current_policy(token: contextvars.Token[Policy | None]) -> None:
    _policy.reset(token)


def authorize(rpc: str, user_id: str | None) -> None:
    """PermissionDenied unless the current call's caller may call `rpc` for `user_id`
    (None: across users) under the current policy; without a policy, nothing to check."""
    policy = _policy.get()
    if policy is not None:
        policy.check(current_caller(), rpc, user_id)


@dataclass(frozen=True)
class Rule:
    caller: str
    rpcs: frozenset[str]
    users: tuple[str, ...] = ("*",)

    def covers_caller(self, caller: Caller) -> bool:
        return caller.identified and self.caller in ("*", caller.name)

    def covers_rpc(self, rpc: str) -> bool:
        return "*" in self.rpcs or rpc in self.rpcs or group_of(rpc) in self.rpcs

    def covers_user(self, user_id: str | None, caller: Caller = ANONYMOUS) -> bool:
        if "*" in self.users:
            return True
        if user_id is None:  # across users: only a rule for every user
            return False
        if "self" in self.users and caller.identified and user_id == caller.name:
            return True
        return any(
            user_id.startswith(u[:-1]) if u.endswith("*") else user_id == u
            for u in self.users
            if u != "self"
        )


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = field(default_factory=tuple)
    source: str = "STATE_POLICY_FILE"

    def allows(self, caller: Caller, rpc: str, user_id: str | None) -> bool:
        return any(
            r.covers_caller(caller) and r.covers_rpc(rpc) and r.covers_user(user_id, caller)
            for r in self.rules
        )

    def check(self, caller: Caller, rpc: str, user_id: str | None) -> None:
        """PermissionDenied unless a rule allows `caller` to call `rpc` for `user_id`
        (None: across users)."""
        if self.allows(caller, rpc, user_id):
            return
        whom = "across users" if user_id is None else f"for user {user_id!r}"
        raise PermissionDenied(
            f"{caller.shown()} may not call {rpc} {whom}: no rule of the state service's "
            f"policy ({self.source}) allows it; ask its operator for a rule, or call with "
            "an identity that has one"
        )


def _strings(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a non-empty list of strings")
    return tuple(value)


def _rule(entry: object, index: int, known: Iterable[str]) -> Rule:
    where = f"rule {index + 1}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    unknown_keys = set(entry) - {"caller", "rpcs", "users", "comment"}
    if unknown_keys:
        raise ValueError(f"{where} has unknown keys {sorted(unknown_keys)}")
    caller = entry.get("caller")
    if not isinstance(caller, str) or not caller:
        raise ValueError(f'{where} needs "caller", the identity it is for ("*" for any)')
    rpcs = frozenset(_strings(entry.get("rpcs"), f'{where} "rpcs"'))
    names = set(known) | set(GROUPS) | {"*"}
    bad = sorted(rpcs - names)
    if bad:
        raise ValueError(f"{where} names unknown RPCs {bad} (groups: read, write, admin)")
    users = _strings(entry.get("users", ["*"]), f'{where} "users"')
    return Rule(caller, rpcs, users)


def load_policy(path: str, known_rpcs: Iterable[str], setting: str = "STATE_POLICY_FILE") -> Policy:
    """The policy in `path`; ConfigError naming `setting` when it cannot be used."""
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{setting}={path!r} cannot be read: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{setting}={path!r} is not JSON: {exc}") from None
    known = list(known_rpcs)
    try:
        rules = document.get("rules") if isinstance(document, dict) else None
        if not isinstance(rules, list) or not rules:
            raise ValueError('it needs a non-empty "rules" list')
        parsed = tuple(_rule(entry, i, known) for i, entry in enumerate(rules))
    except ValueError as exc:
        raise ConfigError(f"{setting}={path!r}: {exc}") from None
    return Policy(parsed, f"{setting}={path}")
