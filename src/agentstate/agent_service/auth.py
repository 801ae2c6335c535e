"""Who the end user of a call is: one identity function for every AgentService RPC.

AGENT_AUTH_MODE picks how a caller proves it (docs/authentication.md):

- `jwt`: an `authorization: Bearer <token>` metadata entry holding a signed JWT (OIDC
  access or ID token). Its signature is checked with the issuer's public keys (a JWKS URL,
  fetched and cached, or a JWKS/PEM file), and its `iss`, `aud`, `exp` (and `nbf`, `iat`
  when present) with AGENT_JWT_LEEWAY_SECONDS of clock skew. Only public-key algorithms
  are accepted. The user is the AGENT_JWT_USER_CLAIM claim.
- `proxy`: an authenticating proxy in front of the service has checked the user and sends
  `agentstate-user-id`; the call must also carry `agentstate-proxy-secret` equal to
  AGENT_PROXY_SECRET, so a pod that merely reaches the port cannot claim to be the proxy
  (k8s/base/agent.yaml adds a NetworkPolicy admitting only the proxy's pods).
- `dev-header`: the bare `agentstate-user-id` header, trusted from anyone: local
  development and tests only; the service logs a warning at start-up.

Refusals are UNAUTHENTICATED with an ErrorInfo reason (UNAUTHENTICATED: no or malformed
credentials; TOKEN_EXPIRED; TOKEN_INVALID; PROXY_UNTRUSTED) and a message that says what
to do; why a token was refused (wrong audience, bad signature, ...) goes to the log, not
to the caller.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import jwt

from agentstate.agent_service import errors
from agentstate.agent_service.config import MIN_PROXY_SECRET_CHARS, AgentServiceSettings
from agentstate.client.metadata import (
    AUTHORIZATION_METADATA_KEY,
    PROXY_SECRET_METADATA_KEY,
    USER_ID_METADATA_KEY,
)
from agentstate.common import jwt_keys
from agentstate.common.config import ConfigError

log = logging.getLogger(__name__)

# ErrorInfo reasons of UNAUTHENTICATED.
NO_CREDENTIALS = "UNAUTHENTICATED"  # the reason a missing identity always had
TOKEN_EXPIRED = "TOKEN_EXPIRED"
TOKEN_INVALID = "TOKEN_INVALID"
PROXY_UNTRUSTED = "PROXY_UNTRUSTED"
TOKEN_TOO_LARGE = "TOKEN_TOO_LARGE"

# The largest access token accepted. The server takes metadata up to MAX_METADATA_BYTES,
# so a larger token reaches this check and gets its ErrorInfo (gRPC's default limit would
# refuse it first with a bare RESOURCE_EXHAUSTED).
MAX_TOKEN_BYTES = 16 * 1024
MAX_METADATA_BYTES = 64 * 1024


Metadata = Sequence[tuple[str, str | bytes]]


class Authenticator(Protocol):
    mode: str

    async def user_id(self, metadata: Metadata, peer: str = "") -> str:
        """The calling end user; raises errors.Unauthenticated (or Unavailable). `peer` is
        the caller's address (gRPC's context.peer()), for the log."""
        ...


def _values(metadata: Metadata, key: str) -> list[str]:
    return [
        value if isinstance(value, str) else value.decode(errors="replace")
        for name, value in metadata
        if name == key
    ]


def _one(metadata: Metadata, key: str, missing: str) -> str:
    values = _values(metadata, key)
    if not values:
        raise errors.Unauthenticated(missing, reason=NO_CREDENTIALS)
    if len(values) > 1:
        # Which one would the gateway have meant? Refuse rather than pick one.
        raise errors.Unauthenticated(
            f"the request metadata carries {key} {len(values)} times; send it exactly once",
            reason=NO_CREDENTIALS,
        )
    return values[0]


def valid_user_id(user_id: object, where: str) -> str:
    if not isinstance(user_id, str) or not user_id or len(user_id) > 128:
        raise errors.InvalidInput(f"{where} must be 1..128 printable characters")
    if not user_id.isprintable():
        raise errors.InvalidInput(f"{where} must be 1..128 printable characters")
    return user_id


class DevHeaderAuth:
    """The bare header, from anyone: development only."""

    mode = "dev-header"

    async def user_id(self, metadata: Metadata, peer: str = "") -> str:
        header = _one(
            metadata,
            USER_ID_METADATA_KEY,
            f"the request metadata carries no {USER_ID_METADATA_KEY}",
        )
        return valid_user_id(header, USER_ID_METADATA_KEY)


class ProxyAuth:
    """The header, from the authenticating proxy only (it also sends the shared secret)."""

    mode = "proxy"

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    async def user_id(self, metadata: Metadata, peer: str = "") -> str:
        sent = _values(metadata, PROXY_SECRET_METADATA_KEY)
        # Constant-time comparison: the secret must not leak through timing.
        if len(sent) != 1 or not hmac.compare_digest(sent[0].encode(), self._secret):
            # The address says which pod got past the NetworkPolicy (never the secret sent).
            log.warning(
                "refused a call from %s that did not come through the authenticating proxy (%s)",
                peer or "an unknown address",
                "no agentstate-proxy-secret" if not sent else "a wrong agentstate-proxy-secret",
            )
            raise errors.Unauthenticated(
                "this service accepts calls only through its authenticating proxy; "
                "send the request to the proxy's address",
                reason=PROXY_UNTRUSTED,
            )
        header = _one(
            metadata,
            USER_ID_METADATA_KEY,
            f"the proxy sent no {USER_ID_METADATA_KEY}: sign in through the proxy",
        )
        return valid_user_id(header, USER_ID_METADATA_KEY)


class JwtAuth:
    mode = "jwt"

    def __init__(self, settings: AgentServiceSettings, keys: jwt_keys.KeySource) -> None:
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._algorithms = list(settings.jwt_algorithms)
        self._leeway = settings.jwt_leeway_seconds
        self._claim = settings.jwt_user_claim
        self._keys = keys

    async def user_id(self, metadata: Metadata, peer: str = "") -> str:
        header = _one(
            metadata,
            AUTHORIZATION_METADATA_KEY,
            "no credentials: send the end user's access token as "
            "`authorization: Bearer <token>` metadata",
        )
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.Unauthenticated(
                "the authorization metadata must be `Bearer <token>`", reason=NO_CREDENTIALS
            )
        if len(token.strip()) > MAX_TOKEN_BYTES:
            # Refused here with a reason, before gRPC's own limit would refuse the whole
            # metadata without one (the server accepts up to MAX_METADATA_BYTES).
            raise errors.Unauthenticated(
                f"the access token is {len(token.strip())} bytes, more than the "
                f"{MAX_TOKEN_BYTES} this service accepts: ask the identity provider for a "
                "smaller token (fewer claims or groups in it)",
                reason=TOKEN_TOO_LARGE,
            )
        try:
            claims = await self._verify(token.strip())
        except jwt.ExpiredSignatureError:
            raise errors.Unauthenticated(
                "the access token has expired: get a new one and retry", reason=TOKEN_EXPIRED
            ) from None
        except (jwt.InvalidTokenError, jwt_keys.Refused) as exc:
            log.info("refused an access token: %s", exc)
            raise errors.Unauthenticated(
                "the access token was refused: it is not a valid token for this service; "
                "sign in again to get one",
                reason=TOKEN_INVALID,
            ) from None
        user = claims.get(self._claim)
        if not isinstance(user, str) or not user or len(user) > 128 or not user.isprintable():
            log.info("refused an access token: its %s claim is not a usable user id", self._claim)
            raise errors.Unauthenticated(
                "the access token carries no usable user id; sign in again to get one",
                reason=TOKEN_INVALID,
            )
        return user

    async def _verify(self, token: str) -> dict[str, Any]:
        try:
            return await jwt_keys.verify(
                token,
                self._keys,
                issuer=self._issuer,
                audience=self._audience,
                algorithms=self._algorithms,
                leeway=self._leeway,
                required_claim=self._claim,
            )
        except jwt_keys.KeysUnavailable as exc:
            raise errors.Unavailable(str(exc)) from None


def build_authenticator(settings: AgentServiceSettings) -> Authenticator:
    """The configured authenticator; ConfigError says what a mode is missing."""
    if settings.auth_mode == "dev-header":
        log.warning(
            "AGENT_AUTH_MODE=dev-header: the %s header is trusted from any caller, so "
            "anyone who reaches this service can act as any user. Development only: use "
            "jwt or proxy in production (docs/authentication.md)",
            USER_ID_METADATA_KEY,
        )
        return DevHeaderAuth()
    if settings.auth_mode == "proxy":
        secret = settings.proxy_secret.get_secret_value()
        if len(secret) < MIN_PROXY_SECRET_CHARS:
            raise ConfigError(
                f"AGENT_AUTH_MODE=proxy needs AGENT_PROXY_SECRET of at least "
                f"{MIN_PROXY_SECRET_CHARS} characters (the value the proxy sends in "
                f"{PROXY_SECRET_METADATA_KEY})"
            )
        return ProxyAuth(secret)
    missing = [
        name
        for name, value in (
            ("AGENT_JWT_ISSUER", settings.jwt_issuer),
            ("AGENT_JWT_AUDIENCE", settings.jwt_audience),
        )
        if not value
    ]
    if settings.jwt_jwks_url and settings.jwt_key_file:
        raise ConfigError(
            "AGENT_JWT_JWKS_URL and AGENT_JWT_KEY_FILE are both set; set only one of them "
            "(the issuer's JWKS URL, or a file with its keys)"
        )
    if missing or not (settings.jwt_jwks_url or settings.jwt_key_file):
        raise ConfigError(
            "AGENT_AUTH_MODE=jwt (the default) needs AGENT_JWT_ISSUER, AGENT_JWT_AUDIENCE "
            "and one of AGENT_JWT_JWKS_URL or AGENT_JWT_KEY_FILE"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + "; for local development only, AGENT_AUTH_MODE=dev-header"
        )
    keys = jwt_keys.key_source(
        settings.jwt_jwks_url, settings.jwt_key_file, settings.jwt_jwks_cache_seconds, "AGENT_JWT"
    )
    return JwtAuth(settings, keys)
