"""Code shared by both services (generated stubs live beside this, in agentstate/*/v1)."""
