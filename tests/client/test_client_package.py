"""The agentstate.client package itself: what importing it loads, its exported and
deprecated names, its settings without pydantic, and interceptors on both clients."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import warnings
from typing import Any, cast

import grpc
import pytest

import agentstate.client
from agentstate.client import AsyncStateClient, ClientSettings, StateClient, types
from agentstate.client.settings import ConfigError
from agentstate.common import config as server_config
from tests.support.paths import REPO

CLIENT_INIT = REPO / "client" / "src" / "agentstate" / "client" / "__init__.py"
GRPC_OR_STUBS = ("grpc", "grpc_status", "google.protobuf", "agentstate.state.", "agentstate.agent.")


def modules_loaded_by(statement: str) -> list[str]:
    """The modules `statement` loads in a fresh interpreter (nothing imported before it)."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_importing_the_types_loads_no_grpc_and_no_stub() -> None:
    loaded = modules_loaded_by("import agentstate.client\nfrom agentstate.client import types")
    assert "agentstate.client.types" in loaded
    assert [m for m in loaded if m.startswith(GRPC_OR_STUBS)] == []
    # Nor do the settings, TLS ones included (grpc's types only under TYPE_CHECKING).
    loaded = modules_loaded_by(
        "from agentstate.client.settings import ClientSettings\n"
        "ClientSettings.from_env({'AGENTSTATE_STATE_TLS_CA_FILE': '/ca.pem'})"
    )
    assert "agentstate.client.settings" in loaded
    assert [m for m in loaded if m.startswith(GRPC_OR_STUBS)] == []
    # The check can fail: a client loads grpc and the stubs.
    loaded = modules_loaded_by("from agentstate.client import StateClient")
    assert {"grpc", "agentstate.state.v1.state_service_pb2_grpc"} <= set(loaded)


def _type_checking_names() -> set[str]:
    """The names agentstate/client/__init__.py imports for type checkers."""
    tree = ast.parse(CLIENT_INIT.read_text())
    [block] = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    return {
        alias.asname or alias.name
        for node in ast.walk(ast.Module(body=block.body, type_ignores=[]))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_every_export_resolves_and_type_checkers_see_the_same_names() -> None:
    exports = set(agentstate.client.__all__)
    assert _type_checking_names() == exports | set(types.DEPRECATED_NAMES)
    for name in exports:
        value = getattr(agentstate.client, name)
        defined_in = sys.modules[agentstate.client._EXPORTS[name]]
        assert value is getattr(defined_in, name), name
    with pytest.raises(AttributeError, match="has no attribute 'NewMesage'"):
        _ = agentstate.client.NewMesage  # type: ignore[attr-defined]


@pytest.mark.parametrize(("old", "new"), sorted(types.DEPRECATED_NAMES.items()))
def test_the_old_record_names_still_work_and_warn(old: str, new: str) -> None:
    for module in (agentstate.client, types):
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}"):
            value = getattr(module, old)
        assert value is getattr(types, new)
    # NewMessage and friends themselves do not warn.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(agentstate.client, new)


def test_client_settings_defaults_and_environment() -> None:
    assert ClientSettings() == ClientSettings.from_env({})
    assert ClientSettings.documented_defaults() == {
        "AGENTSTATE_STATE_ADDRESS": "127.0.0.1:50051",
        "AGENTSTATE_STATE_TIMEOUT_SECONDS": "10",
        "AGENTSTATE_STATE_MAX_MESSAGE_BYTES": "16777216",
        "AGENTSTATE_STATE_TLS": "off",
        "AGENTSTATE_STATE_TLS_CA_FILE": "empty",
        "AGENTSTATE_STATE_TLS_CERT_FILE": "empty",
        "AGENTSTATE_STATE_TLS_KEY_FILE": "empty",
        "AGENTSTATE_STATE_TLS_SERVER_NAME": "empty",
        "AGENTSTATE_STATE_TOKEN_FILE": "empty",
    }
    settings = ClientSettings.from_env(
        {
            "AGENTSTATE_STATE_ADDRESS": " unix:///run/state.sock ",
            "AGENTSTATE_STATE_TIMEOUT_SECONDS": "2.5",
            "AGENTSTATE_STATE_MAX_MESSAGE_BYTES": "",  # empty: the default
            "UNRELATED": "ignored",
        }
    )
    assert settings == ClientSettings(
        state_address="unix:///run/state.sock", state_timeout_seconds=2.5
    )
    assert ClientSettings(state_timeout_seconds=5).state_timeout_seconds == 5.0
    # Plaintext unless a TLS setting is set; the files make it TLS.
    assert not settings.security().uses_tls
    tls = ClientSettings.from_env({"AGENTSTATE_STATE_TLS_CA_FILE": "/etc/ca.pem"}).security()
    assert tls.uses_tls and tls.ca_file == "/etc/ca.pem"
    assert ClientSettings.from_env({"AGENTSTATE_STATE_TLS": "on"}).security().uses_tls
    with pytest.raises(ConfigError, match="AGENTSTATE_STATE_TLS='yes' must be one of on, off"):
        ClientSettings.from_env({"AGENTSTATE_STATE_TLS": "yes"})
    with pytest.raises(ValueError, match="over TLS only"):
        ClientSettings(state_token_file="/run/token").security()
    with pytest.raises(AttributeError):  # frozen
        settings.state_address = "elsewhere"  # type: ignore[misc]
    # The servers' ConfigError is this one: `except ConfigError` catches every setting.
    assert server_config.ConfigError is ConfigError


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"AGENTSTATE_STATE_TIMEOUT_SECONDS": "soon"},
            "AGENTSTATE_STATE_TIMEOUT_SECONDS='soon' is not a number",
        ),
        (
            {"AGENTSTATE_STATE_TIMEOUT_SECONDS": "0"},
            "AGENTSTATE_STATE_TIMEOUT_SECONDS=0 must be greater than 0",
        ),
        (
            {"AGENTSTATE_STATE_TIMEOUT_SECONDS": "nan"},
            "AGENTSTATE_STATE_TIMEOUT_SECONDS='nan' is not a finite number",
        ),
        (
            {"AGENTSTATE_STATE_MAX_MESSAGE_BYTES": "1e6"},
            "AGENTSTATE_STATE_MAX_MESSAGE_BYTES='1e6' is not an integer",
        ),
        (
            {"AGENTSTATE_STATE_MAX_MESSAGE_BYTES": "100"},
            "AGENTSTATE_STATE_MAX_MESSAGE_BYTES=100 must be at least 1024",
        ),
    ],
)
def test_a_bad_client_setting_is_one_line_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        ClientSettings.from_env(env)
    assert str(raised.value) == message


def test_both_problems_are_named_and_keyword_values_are_checked_too() -> None:
    with pytest.raises(ConfigError) as raised:
        ClientSettings.from_env(
            {"AGENTSTATE_STATE_TIMEOUT_SECONDS": "-1", "AGENTSTATE_STATE_MAX_MESSAGE_BYTES": "x"}
        )
    assert str(raised.value) == (
        "AGENTSTATE_STATE_TIMEOUT_SECONDS=-1 must be greater than 0; "
        "AGENTSTATE_STATE_MAX_MESSAGE_BYTES='x' is not an integer"
    )
    with pytest.raises(ValueError, match="state_timeout_seconds=inf is not a finite number"):
        ClientSettings(state_timeout_seconds=math.inf)
    with pytest.raises(ValueError, match="max_message_bytes='big' is not an integer"):
        ClientSettings(max_message_bytes="big")  # type: ignore[arg-type]


def _rpc_name(method: str | bytes) -> str:
    """The RPC of a call's details (grpc.aio gives the method path as bytes)."""
    return (method.decode() if isinstance(method, bytes) else method).rsplit("/", 1)[-1]


class _CountingInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """grpc's own (sync) interceptor kind: counts the calls going through it."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.methods.append(_rpc_name(details.method))
        return continuation(details, request)


class _AsyncCountingInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.methods.append(_rpc_name(details.method))
        return await continuation(details, request)


def test_the_sync_client_takes_interceptors(state_process_address: str, user_id: str) -> None:
    """connect(interceptors=) on both clients (it existed on the async one only)."""
    counting = _CountingInterceptor()
    with StateClient.connect(state_process_address, interceptors=[counting]) as client:
        created = client.create_conversation(user_id)
        client.get_conversation(user_id, created.conversation_id)
    assert counting.methods == ["CreateConversation", "GetConversation"]


async def test_the_async_client_takes_interceptors(state_address: str, user_id: str) -> None:
    counting = _AsyncCountingInterceptor()
    # grpc-stubs leave grpc.aio.ClientInterceptor a placeholder that callers must cast to.
    interceptor = cast("grpc.aio.ClientInterceptor", counting)
    async with AsyncStateClient.connect(state_address, interceptors=[interceptor]) as client:
        created = await client.create_conversation(user_id)
        await client.get_conversation(user_id, created.conversation_id)
    assert counting.methods == ["CreateConversation", "GetConversation"]
