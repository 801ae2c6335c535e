"""Worker processes of the framework tests: `python -m tests.support.framework_workers COMMAND
ARGS...` prints one JSON line (only the framework a command needs is imported).

  openai-add ADDRESS USER SESSION COUNT TAG   add COUNT items after a line on stdin
  openai-turn ADDRESS USER SESSION QUESTION   one Runner.run turn on the session
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


def main() -> None:
    command, *args = sys.argv[1:]
    from tests.support import openai_fakes

    result: Any
    if command == "openai-add":
        address, user, session_id, count, tag = args
        result = asyncio.run(openai_fakes.openai_add(address, user, session_id, int(count), tag))
    elif command == "openai-turn":
        result = asyncio.run(openai_fakes.openai_turn(*args))
    else:
        raise SystemExit(f"unknown command {command}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
