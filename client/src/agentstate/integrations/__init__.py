"""Agent frameworks on the state service: each adapter is an optional extra and sits on
top of `agentstate.client`; none imports the services' internals or touches a database."""
