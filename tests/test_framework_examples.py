"""The framework examples under src/agentstate/examples/frameworks run as documented
(docs/frameworks/), against a state service process, offline."""

from __future__ import annotations

import subprocess
import sys


def test_framework_examples_run(state_process_address: str) -> None:
    examples = ["openai_agents_session", "adk_session_service"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", f"agentstate.examples.frameworks.{name}", state_process_address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in examples
    ]
    for name, proc in zip(examples, procs, strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name}: {err}"
        # The second turn's model saw the first turn, from a fresh client and session.
        assert "You have asked 2 question(s); the first was 'Where is order 88235?'" in out, out
