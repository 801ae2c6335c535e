"""The turn runtime: one Chat or Confirm turn, from start to saved state.

- runner.py: the turn as a whole (Chat, Confirm, Stop), two state calls when
  nothing goes wrong;
- lease.py: the run lease, its heartbeat and Stop from any replica;
- cards.py: confirmation cards, settled exactly once;
- loop.py: the ReAct loop (model steps, tool calls, showing a card);
- persistence.py: saving a turn (and failing cleanly);
- port.py: what the runtime needs of session state (ClientStatePort implements it);
- texts.py: every word the runtime says.

No gRPC, no SQL, no protobuf here.
"""

from agentstate.agent_service.runtime.lease import LeaseSettings
from agentstate.agent_service.runtime.runner import RuntimeSettings, TurnRunner

__all__ = ["LeaseSettings", "RuntimeSettings", "TurnRunner"]
