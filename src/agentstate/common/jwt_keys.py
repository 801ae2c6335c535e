"""Signed JWTs checked against an issuer's public keys: the one verifier of the agent's
end-user tokens (agent_service/auth.py) and the state service's service tokens
(state_service/policy.py).

Keys come from a JWKS URL (fetched, cached, refetched for an unknown `kid`, rate-limited)
or a JWKS/PEM file. Only the algorithms given are accepted, checked before any key lookup
(`none` and HS* never get that far). A token refused is `Refused` (why: for the log, never
for the caller); keys that cannot be had are `KeysUnavailable` (retry later).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import jwt
from cryptography.hazmat.primitives import serialization

from agentstate.common.config import ConfigError

log = logging.getLogger(__name__)

# An unknown `kid` refetches the JWKS (the issuer rotated its keys), at most this often:
# tokens with made-up kids must not turn the service into a load generator on the issuer.
_MIN_REFETCH_SECONDS = 10.0
_JWKS_TIMEOUT_SECONDS = 5.0


class KeysUnavailable(Exception):
    """The issuer's keys cannot be fetched or used right now; the message is the caller's."""


class KeySource(Protocol):
    async def key_for(self, kid: str | None) -> Any: ...


def _match(keys: jwt.PyJWKSet, kid: str | None) -> jwt.PyJWK | None:
    if kid is None:
        # A token without `kid` is only unambiguous against a set of one key.
        return keys.keys[0] if len(keys.keys) == 1 else None
    return next((key for key in keys.keys if key.key_id == kid), None)


class FileKeys:
    """A JWKS JSON file or a PEM public key, read once at start-up."""

    def __init__(self, path: str, setting: str) -> None:
        self._setting = setting
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{setting}={path!r} cannot be read: {exc}") from None
        self._pem: Any = None
        self._jwks: jwt.PyJWKSet | None = None
        try:
            if text.lstrip().startswith("{"):
                document = json.loads(text)
                self._jwks = jwt.PyJWKSet.from_dict(document)
            else:
                self._pem = serialization.load_pem_public_key(text.encode())
        except jwt.PyJWKSetError:
            raise ConfigError(
                f"{setting}={path!r} is a JWKS without a usable key: {unusable_keys(document)}"
            ) from None
        except (ValueError, jwt.InvalidKeyError) as exc:
            raise ConfigError(
                f"{setting}={path!r} is neither a JWKS nor a PEM public key: {exc}"
            ) from None

    async def key_for(self, kid: str | None) -> Any:
        if self._pem is not None:
            return self._pem
        assert self._jwks is not None
        found = _match(self._jwks, kid)
        if found is None:
            raise Refused(f"no key of {self._setting} has the token's kid")
        return found.key


class RemoteKeys:
    """The issuer's JWKS over HTTP(S): PyJWKClient keeps it for the cache lifetime; a kid
    not in it refetches (key rotation), rate-limited."""

    def __init__(self, url: str, cache_seconds: float, setting: str) -> None:
        self._setting = setting
        self._client = _JwksClient(
            url, cache_jwk_set=True, lifespan=cache_seconds, timeout=_JWKS_TIMEOUT_SECONDS
        )
        self._url = url
        self._last_refetch = -_MIN_REFETCH_SECONDS
        self._lock = asyncio.Lock()

    async def _jwk_set(self, refresh: bool) -> jwt.PyJWKSet:
        try:
            # urllib under the hood: off the event loop.
            return await asyncio.to_thread(self._client.get_jwk_set, refresh)
        except jwt.PyJWKClientConnectionError as exc:
            log.warning("the JWKS at %s could not be fetched: %s", self._setting, exc)
            raise KeysUnavailable(
                "the identity provider's signing keys cannot be fetched right now; retry later"
            ) from None
        except (jwt.PyJWKClientError, jwt.PyJWKSetError, json.JSONDecodeError) as exc:
            # 200 with something that is not a JWKS (an HTML login page, invalid JSON, {},
            # no keys): the issuer is misconfigured, which is not the caller's fault.
            if isinstance(exc, json.JSONDecodeError):
                problem = f"it is not JSON ({exc})"
            elif isinstance(exc, jwt.PyJWKSetError):
                problem = "no usable key: " + unusable_keys(self._client.last_document)
            else:
                problem = str(exc)
            log.warning("the JWKS at %s (%s) is unusable: %s", self._setting, self._url, problem)
            raise KeysUnavailable(
                "the identity provider's signing keys cannot be used right now; retry later"
            ) from None

    async def key_for(self, kid: str | None) -> Any:
        async with self._lock:  # one fetch at a time; the others use its result
            found = _match(await self._jwk_set(refresh=False), kid)
            now = time.monotonic()
            if found is None and now - self._last_refetch >= _MIN_REFETCH_SECONDS:
                self._last_refetch = now
                found = _match(await self._jwk_set(refresh=True), kid)
        if found is None:
            raise Refused("no key of the JWKS has the token's kid")
        return found.key


def unusable_keys(document: object) -> str:
    """Why a JWKS document has no usable key, key by key. PyJWT only says "did not contain
    any usable keys. Perhaps 'cryptography' is not installed?", which is rarely true: here
    it is installed (this module imports it), so the cause is the keys themselves."""
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        return 'it has no "keys" list'
    if not keys:
        return 'its "keys" list is empty'
    problems = []
    for index, entry in enumerate(keys):
        name = entry.get("kid") if isinstance(entry, dict) else None
        label = f"key {name!r}" if isinstance(name, str) else f"key #{index + 1}"
        try:
            jwt.PyJWK(entry)
        except (jwt.PyJWTError, ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append(f"{label} is broken ({exc or type(exc).__name__})")
        else:  # pragma: no cover - a usable key makes the set usable
            problems.append(f"{label} is usable")
    return "; ".join(problems)


class _JwksClient(jwt.PyJWKClient):
    """PyJWKClient that keeps the last document it fetched, so that a JWKS without a
    usable key can be explained key by key (PyJWT's own message blames a missing
    `cryptography`). `_as_jwk_set_payload` is the hook PyJWT passes every fetched
    document through; without it (another PyJWT) the explanation is only shorter."""

    last_document: object = None

    def _as_jwk_set_payload(self, data: Any) -> dict[str, Any]:  # type: ignore[override]
        self.last_document = data
        checked: dict[str, Any] = jwt.PyJWKClient._as_jwk_set_payload(data)
        return checked


class Refused(Exception):
    """Why a token was refused: logged, never sent."""


def key_source(jwks_url: str, key_file: str, cache_seconds: float, prefix: str) -> KeySource:
    """The keys of `jwks_url` or `key_file` (exactly one is set); `prefix` names the
    settings (AGENT_JWT, STATE_TOKEN) in messages."""
    if key_file:
        return FileKeys(key_file, f"{prefix}_KEY_FILE")
    return RemoteKeys(jwks_url, cache_seconds, f"{prefix}_JWKS_URL")


async def verify(
    token: str,
    keys: KeySource,
    *,
    issuer: str,
    audience: str,
    algorithms: Sequence[str],
    leeway: float,
    required_claim: str,
) -> dict[str, Any]:
    """The token's claims; jwt.ExpiredSignatureError, jwt.InvalidTokenError or Refused
    when it is not valid; KeysUnavailable when the keys cannot be had."""
    header = jwt.get_unverified_header(token)
    algorithm = header.get("alg")
    # Before any key lookup: `none`, HS* and anything not configured never get that far.
    if not isinstance(algorithm, str) or algorithm not in algorithms:
        raise Refused(f"algorithm {algorithm!r} is not among the accepted algorithms")
    kid = header.get("kid")
    key = await keys.key_for(kid if isinstance(kid, str) else None)
    claims: dict[str, Any] = jwt.decode(
        token,
        key=key,
        algorithms=[algorithm],
        audience=audience,
        issuer=issuer,
        leeway=leeway,
        options={"require": ["exp", "iss", "aud", required_claim]},
    )
    return claims
