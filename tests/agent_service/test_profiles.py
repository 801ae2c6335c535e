"""The profile seam: the product with no profile, selecting one, and refusing bad ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.model.scripted import ScriptedModel
from agentstate.agent_service.profile import GENERIC_SYSTEM_PROMPT, Profile, load_profile
from agentstate.agent_service.server import build_tools
from agentstate.common.config import ConfigError
from agentstate.dev.processes import ServiceProcess
from agentstate.examples.order_demo import OrderDemoProfile
from tests.support import paths
from tests.support.agent_harness import RecordingModel, Stack, metadata
from tests.support.source_example import QUESTION
from tests.support.state_process import StateServices, on_postgres

REPO = paths.REPO


@pytest.fixture
async def bare(database_url: str, orders_database_url: str) -> AsyncIterator[Stack]:
    """A state service and one agent replica with no profile."""
    running = Stack(database_url, orders_database_url)
    await running.start_state()
    yield running
    await running.close()


async def test_without_a_profile_the_agent_has_no_business_tools(bare: Stack, user_id: str) -> None:
    model = RecordingModel(ScriptedModel())
    client = await bare.start_agent(model=model, profile=Profile())
    turn = await client.chat(user_id, QUESTION)
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert turn.kinds()[-2:] == ["finish", "done"]
    assert turn.of("block") == []
    assert turn.reply == ScriptedModel.no_business
    [request] = model.requests
    assert request.tools == [] and request.system_prompt == GENERIC_SYSTEM_PROMPT
    conversation_id = turn.meta.conversation_id

    # Generic behaviour still works: facts told are remembered, across turns.
    told = await client.chat(user_id, "我的名字是李雷", conversation_id)
    assert told.reply == "好的，记住了：你的名字是李雷。"
    asked = await client.chat(user_id, "我的名字是什么？", conversation_id)
    assert asked.reply == "你之前说过，你的名字是李雷。"

    # Asking for a business tool by name finds none: the demo's tools are not there.
    for tool in ("query_order", "cancel_order", "load_skill"):
        forced = await client.chat(user_id, f"/{tool} {{}}", conversation_id)
        [failed] = [b for b in forced.of("block") if b.status == pb.TOOL_CALL_STATUS_FAILED]
        assert failed.tool_name == tool and f"没有名为 {tool} 的工具" in failed.summary
    state, _ = await bare.reader.state(user_id, conversation_id)
    assert len(state.context) == 2 * 3 + 3 * 4  # three plain turns, three tool cycles


def test_load_profile_forms_and_errors() -> None:
    assert type(load_profile("", {})) is Profile
    assert type(load_profile("  ", {})) is Profile
    bad = {
        "no_such_profile": "no profile registered under that name (registered: order_demo",
        "two words": "expected a registered name or MODULE:ATTRIBUTE",
        "no_such_module:create": "cannot import no_such_module",
        "agentstate.examples.order_demo:no_such_factory": (
            "agentstate.examples.order_demo has no no_such_factory"
        ),
        "agentstate.examples.order_demo.profile:SYSTEM_PROMPT": "is not a profile factory",
        "agentstate.examples.order_demo:OrderDemoSettings": "not a Profile",
        "agentstate.examples.order_demo:": "expected MODULE:ATTRIBUTE",
    }
    for spec, message in bad.items():
        with pytest.raises(ConfigError) as raised:
            load_profile(spec, {})
        assert message in str(raised.value), (spec, raised.value)
        assert str(raised.value).startswith(f"AGENT_PROFILE={spec.strip()!r}")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("order-demo", "AGENT_PROFILE='order-demo': no profile registered under that name"),
        ("examples.nothing:make", "AGENT_PROFILE='examples.nothing:make': cannot import"),
    ],
)
def test_an_invalid_profile_exits_2_before_serving(spec: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentstate.agent_service"],
        env={"PATH": "/usr/bin:/bin", "AGENT_PROFILE": spec, "AGENT_LISTEN_ADDRESS": "127.0.0.1:0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"agentstate-agent: {message}" in done.stderr
    assert "listening on" not in done.stdout + done.stderr


def test_a_module_path_profile_serves(
    state_services: StateServices, database_url: str, user_id: str
) -> None:
    agent = ServiceProcess(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": state_services.serve(on_postgres(database_url)),
            "AGENT_PROFILE": "agentstate.examples.order_demo:create_profile",
            "ORDERS_DATABASE_URL": "",
        },
    )
    try:
        address = agent.wait_ready()
        assert "profile order_demo, model scripted-order-model" in agent.output
        with grpc.insecure_channel(address) as channel:
            events = [
                r.event
                for r in pb_grpc.AgentServiceStub(channel).Chat(
                    pb.ChatRequest(question=QUESTION), metadata=metadata(user_id)
                )
            ]
        [card] = [e.confirm for e in events if e.HasField("confirm")]
        assert card.title == "取消订单 88235"
    finally:
        assert agent.terminate() == 0, agent.output


def test_tools_and_handbooks_of_a_profile() -> None:
    assert build_tools(Profile()).specs() == []  # not even load_skill without handbooks
    names = [spec.name for spec in build_tools(OrderDemoProfile()).specs()]
    assert names == ["load_skill", "query_order", "cancel_order"]

    class Broken(OrderDemoProfile):
        name = "broken"

        def skills(self) -> dict[str, str]:
            return {}

    # cancel_order would never be offered: refused at start-up instead.
    with pytest.raises(ConfigError, match="'cancel_order' needs the handbook 'order-change'"):
        build_tools(Broken())


def test_the_product_never_imports_the_examples() -> None:
    """The product (everything in agentstate but its examples and local dev helpers) stands
    alone: a profile plugs in, and no service runs the helpers."""
    product = REPO / "src" / "agentstate"
    outside = (product / "examples", product / "dev")
    for path in product.rglob("*.py"):
        if any(part in path.parents for part in outside):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("agentstate.examples", "agentstate.dev")), (
                    f"{path}: imports {name}"
                )
