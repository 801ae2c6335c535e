"""The framework examples under src/agentstate/examples/frameworks run as documented
(docs/frameworks/) against a state service process, offline (their `main`, in-process:
the frameworks are already imported here)."""

from __future__ import annotations

import pytest

from agentstate.examples.frameworks import adk_session_service, openai_agents_session


@pytest.mark.parametrize("example", [openai_agents_session, adk_session_service])
async def test_framework_example_runs(
    example: object, state_process_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await example.main(state_process_address)  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    # The second turn's model saw the first turn, from a fresh client and session.
    assert "You have asked 2 question(s); the first was 'Where is order 88235?'" in out, out
