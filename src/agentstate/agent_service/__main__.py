"""`agentstate-agent`: run the agent service.

Settings come from environment variables: see agent_service/config.py and
docs/reference/settings.md.
AGENT_PROFILE picks the profile (agent_service/profile.py); a bad one exits with 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.profile import load_profile
from agentstate.agent_service.server import serve
from agentstate.common import telemetry
from agentstate.common.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentstate-agent", description=__doc__)
    parser.parse_args(argv)
    try:
        telemetry.configure_logging("agentstate-agent")
        settings = AgentServiceSettings.from_env()
        profile = load_profile(settings.profile, os.environ)
        telemetry.configure_from_env("agentstate-agent")
        asyncio.run(serve(settings, profile))
    except ConfigError as exc:
        print(f"agentstate-agent: {exc}", file=sys.stderr)
        return 2
    finally:
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
