"""Fixtures of the agent service's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.agent_service.test_openai_compat import FakeChatServer


@pytest.fixture
async def server() -> AsyncIterator[FakeChatServer]:
    """A local OpenAI-compatible chat-completions server (test_openai_compat.py)."""
    fake = FakeChatServer()
    await fake.start()
    yield fake
    await fake.stop()
