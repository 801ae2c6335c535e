"""Agent frameworks on the state service. Each sits on agentstate.client only and needs its
framework from the matching extra (for example `pip install 'agentstate[adk]'`)."""
