"""Who calls the state service, whether the policy lets them, and the audit trail.

`CallerInterceptor` runs before every state RPC (health and reflection excepted):

1. Identity: a service token (`authorization: Bearer <JWT>`, checked by the same verifier
   as the agent's end-user tokens, agentstate.common.jwt_keys) names the caller by its
   STATE_TOKEN_CALLER_CLAIM; else a client certificate (mTLS) by its SPIFFE ID (a
   `spiffe://` URI SAN) or, without one, its subject's common name; else the caller is
   anonymous. A token that is presented must be valid (UNAUTHENTICATED otherwise, even
   without a policy): a caller never silently becomes anonymous. Only a state service
   with neither tokens nor a policy (the sidecar) ignores an `authorization` header.
2. Authorisation: with a policy (policy.py), an anonymous caller is UNAUTHENTICATED
   (CALLER_UNAUTHENTICATED) and a call no rule allows is PERMISSION_DENIED, both before
   the handler runs, so a refusal changes nothing.
3. Audit: every call that may change data (the policy's `write` and `admin` groups),
   allowed or refused, writes one structured log line on the `agentstate.audit` logger
   and an `agentstate.audit` event on the call's span: caller, how it proved it, its
   address, the RPC, the user and conversation ids, the outcome and, for deletes, the
   counts. Never a payload, a title or any other user content.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc
import jwt
from opentelemetry import trace

from agentstate.common import error_details, jwt_keys
from agentstate.common.unary_guard import UnaryBehaviour, UnaryGuardInterceptor
from agentstate.state_service.domain import (
    CallerUnauthenticated,
    PermissionDenied,
    StateServiceError,
    StoreUnavailable,
)
from agentstate.state_service.error_reasons import state_error_detail
from agentstate.state_service.policy import (
    ANONYMOUS,
    Caller,
    Policy,
    group_of,
    reset_current_caller,
    reset_current_policy,
    set_current_caller,
    set_current_policy,
)
from agentstate.state_service.servicer.translate import status_code

audit_log = logging.getLogger("agentstate.audit")
log = logging.getLogger(__name__)

# Service tokens: public-key algorithms only (as the agent's AGENT_JWT_ALGORITHMS).
TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "ES256", "ES384", "EdDSA")
MAX_TOKEN_BYTES = 16 * 1024
# Response fields that count what a call removed: the audit's counts.
_COUNT_FIELDS = ("conversations_deleted", "messages_deleted", "states_deleted")


class TokenVerifier:
    """Service tokens of one issuer and audience; the caller is `claim`."""

    def __init__(
        self, keys: jwt_keys.KeySource, issuer: str, audience: str, claim: str, leeway: float = 30
    ) -> None:
        self._keys = keys
        self._issuer = issuer
        self._audience = audience
        self._claim = claim
        self._leeway = leeway

    async def caller(self, token: str) -> str:
        if len(token) > MAX_TOKEN_BYTES:
            raise CallerUnauthenticated(
                f"the service token is {len(token)} bytes, more than {MAX_TOKEN_BYTES}: "
                "ask the token issuer for a smaller one"
            )
        try:
            claims = await jwt_keys.verify(
                token,
                self._keys,
                issuer=self._issuer,
                audience=self._audience,
                algorithms=TOKEN_ALGORITHMS,
                leeway=self._leeway,
                required_claim=self._claim,
            )
        except jwt.ExpiredSignatureError:
            raise CallerUnauthenticated(
                "the service token has expired: get a new one and retry"
            ) from None
        except (jwt.InvalidTokenError, jwt_keys.Refused) as exc:
            log.info("refused a service token: %s", exc)
            raise CallerUnauthenticated(
                "the service token was refused: it is not a valid token for this state "
                "service (issuer, audience, signature or expiry); get one from its issuer"
            ) from None
        except jwt_keys.KeysUnavailable as exc:
            raise StoreUnavailable(str(exc)) from None
        name = claims.get(self._claim)
        if not isinstance(name, str) or not name or not name.isprintable():
            raise CallerUnauthenticated(
                f"the service token's {self._claim} claim does not name a caller"
            )
        return name


def _text(values: Iterable[bytes] | None) -> str:
    first = next(iter(values or ()), b"")
    return first.decode(errors="replace")


def certificate_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The SPIFFE ID of the peer's certificate, else its common name; "" without one."""
    auth = context.auth_context() or {}
    spiffe = _text(auth.get("peer_spiffe_id"))
    if spiffe:
        return spiffe
    for san in auth.get("x509_subject_alternative_name", []):
        text = san.decode(errors="replace")
        if text.startswith("spiffe://"):
            return text
    return _text(auth.get("x509_common_name"))


async def identify(
    context: grpc.aio.ServicerContext[Any, Any],
    tokens: TokenVerifier | None,
    strict: bool = True,
    certificates: bool = True,
) -> Caller:
    """The caller of this call; CallerUnauthenticated for a token that is not valid (or,
    when `strict`, for any token where none are accepted). `certificates`: whether a
    client may have presented a certificate (False: the server trusts no client CA, so
    none was asked for, and the call's auth context is not read)."""
    peer = context.peer() or ""
    bearer = [
        (v if isinstance(v, str) else v.decode(errors="replace"))
        for k, v in (context.invocation_metadata() or ())
        if k == "authorization"
    ]
    if bearer and tokens is None and not strict:
        bearer = []  # no tokens configured and no policy: the header means nothing here
    if bearer:
        if tokens is None:
            raise CallerUnauthenticated(
                "this state service accepts no service tokens (STATE_TOKEN_ISSUER is not "
                "set): identify with a client certificate, or send no authorization"
            )
        scheme, _, token = bearer[0].strip().partition(" ")
        if len(bearer) > 1 or scheme.lower() != "bearer" or not token.strip():
            raise CallerUnauthenticated(
                "send the service token once, as `authorization: Bearer <token>` metadata"
            )
        return Caller(await tokens.caller(token.strip()), "token", peer)
    name = certificate_identity(context) if certificates else ""
    if name:
        return Caller(name, "mtls", peer)
    return Caller("", "none", peer)


def _user_of(request: Any) -> str | None:
    """The request's user; None for a request across users (no or an empty user_id)."""
    user = getattr(request, "user_id", "")
    return str(user) if user else None


def _conversations_of(request: Any) -> list[str]:
    one = getattr(request, "conversation_id", "")
    many = list(getattr(request, "conversation_ids", ()) or ())
    return ([one] if one else []) + [str(c) for c in many]


_COUNTS_OF: dict[type, tuple[str, ...]] = {}


def _count_fields(response: Any) -> tuple[str, ...]:
    """The count fields a response type has (looked up once per type: this is per call)."""
    kind = type(response)
    found = _COUNTS_OF.get(kind)
    if found is None:
        found = _COUNTS_OF[kind] = tuple(n for n in _COUNT_FIELDS if hasattr(response, n))
    return found


def audit(
    caller: Caller,
    rpc: str,
    request: Any,
    outcome: str,
    response: Any = None,
    group: str | None = None,
) -> None:
    """One structured line and one span event: who did what to whose data. Every write
    pays for it, so it builds its fields once, with the log's names (`audit_caller`)."""
    user = _user_of(request) or ""
    extra: dict[str, Any] = {
        "audit_caller": caller.name or "anonymous",
        "audit_via": caller.via,
        "audit_peer": caller.peer,
        "audit_rpc": rpc,
        "audit_group": group or group_of(rpc),
        "audit_user_id": user,
        "audit_conversation_ids": _conversations_of(request),
        "audit_outcome": outcome,
    }
    if response is not None:
        for name in _count_fields(response):
            extra[f"audit_{name}"] = int(getattr(response, name))
    audit_log.info(
        "audit: %s %s user=%s outcome=%s", extra["audit_caller"], rpc, user, outcome, extra=extra
    )
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            "agentstate.audit",
            {"audit." + k[6:]: v for k, v in extra.items() if v != []},
        )


def audit_operation(by: str, operation: str, counts: dict[str, int], **ids: str) -> None:
    """The audit line and span event of an administrative operation that is not an RPC
    (the retention sweep, `agentstate-state purge`): who (`by`), what, and the counts."""
    fields: dict[str, Any] = {
        "audit.caller": by,
        "audit.via": "local",
        "audit.rpc": operation,
        "audit.group": "admin",
        "audit.outcome": "ok",
        **{f"audit.{k}": v for k, v in ids.items()},
        **{f"audit.{k}": v for k, v in counts.items()},
    }
    audit_log.info(
        "audit: %s %s outcome=ok",
        by,
        operation,
        extra={k.replace(".", "_"): v for k, v in fields.items()},
    )
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event("agentstate.audit", fields)


class CallerInterceptor(UnaryGuardInterceptor):
    """Identity, policy and audit around every state RPC (see the module's doc).

    Built once per method (UnaryGuardInterceptor): everything per call happens inside
    the handler, and the interceptors inside this one (admission, request decoding)
    decide by method alone."""

    def __init__(
        self,
        policy: Policy | None,
        tokens: TokenVerifier | None,
        audit_calls: bool = True,
        certificates: bool = True,
    ) -> None:
        self.policy = policy
        self.tokens = tokens
        self.audit_calls = audit_calls
        self.certificates = certificates  # False: no client CA, so no client certificates
        super().__init__()

    def guard(self, behaviour: UnaryBehaviour, method: str) -> UnaryBehaviour:
        rpc = method.rsplit("/", 1)[-1]
        group = group_of(rpc)
        audited = self.audit_calls and group != "read"

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            caller = ANONYMOUS
            # A read across users (listing every user's conversations) is audited too.
            audited_call = audited or (self.audit_calls and _user_of(request) is None)
            try:
                caller = await identify(
                    context, self.tokens, self.policy is not None, self.certificates
                )
                if self.policy is not None:
                    if not caller.identified:
                        raise CallerUnauthenticated(
                            "this state service requires callers to identify themselves: "
                            "present a client certificate its STATE_TLS_CLIENT_CA_FILE "
                            "trusts, or a service token as `authorization: Bearer <token>`"
                        )
                    self.policy.check(caller, rpc, _user_of(request))
            except StateServiceError as exc:
                if audited_call or isinstance(exc, PermissionDenied):
                    audit(caller, rpc, request, f"refused: {exc.reason}")
                await error_details.abort(
                    context, status_code(exc), str(exc), state_error_detail(exc)
                )
            token = set_current_caller(caller)
            policy_token = set_current_policy(self.policy)
            try:
                response = await behaviour(request, context)
            except BaseException:
                if audited_call:
                    code = context.code() if hasattr(context, "code") else None
                    audit(caller, rpc, request, f"failed: {getattr(code, 'name', code)}")
                raise
            finally:
                reset_current_policy(policy_token)
                reset_current_caller(token)
            if audited_call:
                audit(caller, rpc, request, "ok", response, group)
            return response

        return guarded
