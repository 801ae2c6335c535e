"""The gRPC metadata names the agent service reads and its callers send.

Defined here, in the client package (which imports neither service), so that the agent
service, the CLI, the web console and any Python caller use one spelling of each.
"""

# The end user of the call: trusted from an authenticating proxy (AGENT_AUTH_MODE=proxy)
# or, for development, from anyone (dev-header).
USER_ID_METADATA_KEY = "agentstate-user-id"
# Carries `Bearer <token>` (AGENT_AUTH_MODE=jwt).
AUTHORIZATION_METADATA_KEY = "authorization"
# The proxy's shared secret, AGENT_PROXY_SECRET: proves a call came through the proxy.
PROXY_SECRET_METADATA_KEY = "agentstate-proxy-secret"
