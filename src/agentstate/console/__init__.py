"""`agentstate-console`: a web console for the agent service (chat, history, inspector).

Its own process. It talks gRPC only: to the agent service for everything a user does,
and read-only to the state service for the inspector. It never imports either service.
"""
