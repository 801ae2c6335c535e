"""The contract from Java and Go: clients built from protos/ with Debian's toolchains.

tests/contract/java/AgentClient.java (grpc-java 1.41) drives the source's worked example through a
real agent service, which keeps its state in a real state service on PostgreSQL;
tests/contract/go/state_client.go (grpc-go, GOPATH mode) drives the state RPCs. Both read the
google.rpc.ErrorInfo details and apply agentstate/service_config.json; small RetryCheck
programs (Java, Go, Node) show that the config, passed as docs/callers.md says, retries a read
served UNAVAILABLE. The clients print one JSON object; the assertions here are on what they
saw. See tests/support/xlang_build.py for when these tests skip (never in CI).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc
from agentstate.state_service.storage.postgres import PostgresStore
from tests.contract.test_cross_language import NODE_DIR
from tests.contract.test_cross_language import _node as node
from tests.support.fault_injection import state_service_with_blips
from tests.support.source_example import QUESTION
from tests.support.xlang_build import SERVICE_CONFIG, Built, build_go, build_java


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Built]]]:
    """Both clients build at once (javac and go build each keep one core busy)."""
    with ThreadPoolExecutor(2) as pool:
        yield {
            "java": pool.submit(build_java, tmp_path_factory.mktemp("java")),
            "go": pool.submit(build_go, tmp_path_factory.mktemp("go")),
        }


def built(builds: dict[str, Future[Built]], language: str) -> Built:
    try:
        return builds[language].result()
    except (pytest.skip.Exception, pytest.fail.Exception):
        raise
    except AssertionError as exc:
        pytest.fail(f"building the {language} client failed: {exc}", pytrace=False)


def run_client(client: Built, program: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [*client.commands[program], *args],
        env=client.env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=180,
        check=False,
    )
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, report
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["failures"] == [], report
    assert proc.returncode == 0, report
    return result


def test_java_client_runs_the_worked_example(
    builds: dict[str, Future[Built]], agent_process_address: str, state_process_address: str
) -> None:
    client = built(builds, "java")
    print(f"java client built in {client.seconds:.1f}s")
    user_id = f"java-{uuid.uuid4()}"
    out = run_client(
        client,
        "AgentClient",
        agent_process_address,
        state_process_address,
        user_id,
        QUESTION,
        str(SERVICE_CONFIG),
    )

    anonymous = out["anonymous_chat"]
    assert (anonymous["code"], anonymous["reason"]) == ("UNAUTHENTICATED", "UNAUTHENTICATED")
    assert out["new_conversation"] is True
    assert out["chat_kinds"][0] == "meta" and out["chat_kinds"][-2:] == ["confirm", "done"]
    assert (out["card_tool"], out["card_order_no"]) == ("cancel_order", "88235")
    assert out["confirm_kinds"][0] == "meta" and out["confirm_kinds"][-2:] == ["finish", "done"]
    assert out["confirm_block_statuses"] == ["TOOL_CALL_STATUS_DENIED"]
    for expected in ("88235", "已支付待发货", "3378.00"):
        assert expected in out["reply"], out["reply"]

    again = out["confirm_again"]
    assert (again["code"], again["reason"]) == ("FAILED_PRECONDITION", "CARD_ALREADY_HANDLED")
    assert "already handled" in again["message"]
    for what in ("stranger_confirm", "stranger_list_messages", "stranger_get_state"):
        seen = out[what]
        assert (seen["code"], seen["reason"], seen["domain"]) == (
            "NOT_FOUND",
            "NOT_FOUND",
            "agentstate.io",
        ), what
        assert seen["metadata"] == {"missing": "conversation"}, what
    assert out["stranger_get_state"]["trailer_missing"] == "conversation"

    assert out["context"] == [
        "USER: text",
        "ASSISTANT: thinking text tool_use load_skill allowed",
        "TOOL: tool_result load_skill success",
        "ASSISTANT: thinking tool_use query_order allowed",
        "TOOL: tool_result query_order success",
        "ASSISTANT: thinking text tool_use cancel_order asking",
        "TOOL: tool_result cancel_order denied",
        "ASSISTANT: thinking text",
    ]

    # What the Java client caused is what Python reads from the state service.
    with grpc.insecure_channel(state_process_address) as channel:
        got = spb_grpc.StateServiceStub(channel).GetState(
            spb.GetStateRequest(user_id=user_id, conversation_id=out["conversation_id"]),
            timeout=10,
        )
    assert got.version == out["state_version"]
    context = json.loads(got.payload)["context"]
    assert len(context) == 8 and context[0]["content"][0]["text"] == QUESTION
    denied = context[6]["content"][0]
    assert (denied["type"], denied["state"], denied["id"]) == (
        "tool_result",
        "denied",
        out["cancel_call_id"],
    )


def test_go_client_drives_the_state_rpcs(
    builds: dict[str, Future[Built]], state_process_address: str
) -> None:
    client = built(builds, "go")
    print(f"go client built in {client.seconds:.1f}s")
    user_id = f"go-{uuid.uuid4()}"
    out = run_client(client, "state_client", state_process_address, user_id, str(SERVICE_CONFIG))

    assert out["service_config_ok"] is True
    assert (out["create_version"], out["cas_version"]) == (1, 2)
    assert out["payload"]["from"] == "go" and out["payload"]["note"] == QUESTION
    errors = out["errors"]
    stale = errors["stale_cas"]
    assert (stale["code"], stale["reason"], stale["domain"]) == (
        "Aborted",
        "VERSION_CONFLICT",
        "agentstate.io",
    )
    assert stale["metadata"] == {"current_version": "2", "expected_version": "1"}
    assert stale["trailers"]["agentstate-current-version"] == "2"
    assert "current version is 2" in stale["message"]
    create_only = errors["create_only_again"]
    assert create_only["metadata"]["current_version"] == "1"
    assert create_only["trailers"]["agentstate-current-version"] == "1"
    assert out["deleted"] == {"conversations": 1, "messages": 1, "states": 1}
    for what in ("upsert_after_delete", "append_after_delete", "get_after_delete"):
        seen = errors[what]
        assert (seen["code"], seen["reason"]) == ("NotFound", "NOT_FOUND"), what
        assert seen["metadata"] == {"missing": "conversation"}, what
        assert seen["trailers"]["agentstate-missing"] == "conversation", what

    # Nothing came back: the conversation stays deleted for every client.
    with grpc.insecure_channel(state_process_address) as channel:
        listed = spb_grpc.StateServiceStub(channel).ListConversations(
            spb.ListConversationsRequest(user_id=user_id), timeout=10
        )
    assert list(listed.conversations) == []


def test_go_reads_a_thread_a_langgraph_graph_wrote(
    builds: dict[str, Future[Built]], state_process_address: str
) -> None:
    """The point of a language-neutral store: a Go service reads what a Python LangGraph
    graph checkpointed (the conversation, found by the thread id, and its checkpoints)."""
    from langchain_core.messages import HumanMessage

    from agentstate.examples.langgraph_approval.graph import QUESTION as CARD_QUESTION
    from agentstate.examples.langgraph_approval.graph import build
    from agentstate.integrations.langgraph import AgentStateSaver

    client = built(builds, "go")
    user_id, thread = f"go-lg-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
    saver = AgentStateSaver(state_process_address, user_id=user_id)
    build(saver).invoke(
        {"messages": [HumanMessage(CARD_QUESTION)], "executed": []},
        {"configurable": {"thread_id": thread}},
    )
    written = list(saver.list({"configurable": {"thread_id": thread}}))
    saver.close()

    out = run_client(
        client, "checkpoint_reader", state_process_address, user_id, thread, str(SERVICE_CONFIG)
    )
    assert out["external_key"] == thread
    seen = out["checkpoints"]
    assert [c["checkpoint_id"] for c in seen] == [t.checkpoint["id"] for t in written]
    assert [c["parent_checkpoint_id"] for c in seen[:-1]] == [c["checkpoint_id"] for c in seen[1:]]
    assert seen[-1]["parent_checkpoint_id"] == ""
    assert seen[-1]["metadata"]["source"] == "input" and seen[-1]["metadata"]["step"] == -1
    assert "messages" in seen[0]["channels"]
    assert seen[0]["pending_writes"] >= 1  # the approval card's interrupt


async def test_every_language_retries_reads_with_the_service_config(
    builds: dict[str, Future[Built]], pg_store: PostgresStore, user_id: str
) -> None:
    """docs/callers.md's way of passing agentstate/service_config.json works in each language:
    a read served UNAVAILABLE twice succeeds on the third attempt."""
    clients = {
        "java": built(builds, "java").commands["RetryCheck"],
        "go": built(builds, "go").commands["retry_check"],
        "node": [node(), str(NODE_DIR / "retry_check.mjs")],
    }
    env = built(builds, "go").env  # GRPC_GO_RETRY=on for Debian's grpc-go 1.33
    async with state_service_with_blips(pg_store) as (blips, address):
        async with grpc.aio.insecure_channel(address) as channel:
            created = await spb_grpc.StateServiceStub(channel).CreateConversation(
                spb.CreateConversationRequest(user_id=user_id, title="retry")
            )
        cid = created.conversation.conversation_id
        for language, command in clients.items():
            blips.failures, blips.attempts = 2, Counter()
            # Not subprocess.run: the server answering it runs on this event loop.
            proc = await asyncio.create_subprocess_exec(
                *command,
                address,
                cid,
                user_id,
                str(SERVICE_CONFIG),
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
            report = f"{language}: exit {proc.returncode}\n{stdout.decode()}\n{stderr.decode()}"
            assert proc.returncode == 0, report
            assert json.loads(stdout.decode().strip().splitlines()[-1]) == {
                "code": "OK",
                "conversation_id": cid,
            }, report
            assert blips.attempts["GetConversation"] == 3, report


async def test_go_reads_an_openai_agents_session(
    builds: dict[str, Future[Built]], state_process_address: str
) -> None:
    """The point of a language-neutral store: what an OpenAI Agents SDK session wrote in
    Python, a Go service reads over gRPC (the conversation by its key, then its items)."""
    from agentstate.client.aio import AsyncStateClient
    from agentstate.integrations.openai_agents import AgentStateSession, session_key

    client = built(builds, "go")
    user_id = f"go-openai-{uuid.uuid4()}"
    written: list[Any] = [
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": "c1", "name": "query_order", "arguments": "{}"},
        {"role": "assistant", "content": "订单 88235 已支付待发货"},
    ]
    async with AsyncStateClient.connect(state_process_address) as state:
        session = AgentStateSession("support-42", client=state, user_id=user_id)
        await session.add_items(written[:2])
        await session.add_items(written[2:])
        conversation_id = await session.conversation_id()
    # Not subprocess.run in this loop's thread: nothing here serves it, but keep it off-loop.
    out = await asyncio.to_thread(
        run_client,
        client,
        "session_items",
        state_process_address,
        user_id,
        session_key("support-42"),
    )
    assert out["conversation_id"] == conversation_id
    assert out["items"] == written and out["seqs"] == [1, 2, 3] and out["revision"] == 3
    assert out["newest"] == written[-1]


def test_a_go_caller_over_mtls_is_held_to_its_rule(
    builds: dict[str, Future[Built]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """grpc-go (crypto/tls, TLS 1.2+, a client certificate) against a state service with
    mTLS and a policy: the reporting rule lets it list and refuses it the state,
    PERMISSION_DENIED with ErrorInfo reason PERMISSION_DENIED.

    Not Java: Debian's grpc-java runs on its netty 4.1.48, built without ALPN ("JDK
    provider does not support ALPN protocol"), and grpc-java needs ALPN for TLS; a
    grpc-java from Maven (netty-tcnative or a current netty) connects as docs/security.md
    shows."""
    from tests.common.test_tls_everywhere import Services

    client = built(builds, "go")
    services = Services(tmp_path_factory.mktemp("tls"))
    try:
        state = services.start(
            "agentstate.state_service",
            {
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                "STATE_STORE": "memory",
                "STATE_TLS_CERT_FILE": str(services.state_cert.cert),
                "STATE_TLS_KEY_FILE": str(services.state_cert.key),
                "STATE_TLS_CLIENT_CA_FILE": str(services.ca.file),
                "STATE_POLICY_FILE": str(services.policy),
            },
        )
        agent = grpc.ssl_channel_credentials(
            root_certificates=services.ca.file.read_bytes(),
            private_key=services.agent_client.key.read_bytes(),
            certificate_chain=services.agent_client.cert.read_bytes(),
        )
        with grpc.secure_channel(state, agent) as channel:
            made = spb_grpc.StateServiceStub(channel).CreateConversation(
                spb.CreateConversationRequest(user_id="gina", title="t"), timeout=5
            )
        cid = made.conversation.conversation_id
        seen = run_client(
            client,
            "tls_check",
            state,
            str(services.ca.file),
            str(services.reporting.cert),
            str(services.reporting.key),
            "gina",
            cid,
        )
    finally:
        codes = services.stop()
    assert codes == [0]
    assert (seen["list"], seen["listed"]) == ("OK", [cid])
    assert seen["get_state"] == "PermissionDenied"
    assert seen["reason"] == "PERMISSION_DENIED"
    assert "reporting (mtls) may not call GetState" in seen["details"]
