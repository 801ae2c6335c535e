# syntax=docker/dockerfile:1
#
# One image for both services and the web console; the pod spec picks the command:
#   agentstate-state   the state service (runs as the agent pod's sidecar)
#   agentstate-agent   the agent service
#   agentstate-console the web console (k8s/overlays/demo-console)
#
#   docker build -t agentstate:0.1.0 .
#
# Only the runtime dependencies are installed (the [console] extra, no [dev]). The image runs as an
# unprivileged user (uid/gid 10001, the runAsUser of k8s/base/agent.yaml) and works with a
# read-only root filesystem: bytecode is compiled at build time.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# .dockerignore admits only what the two distributions are built from: agentstate-client
# (client/) and the servers (.), installed in one resolve so the local client is used.
COPY . .
RUN /opt/venv/bin/pip install ./client '.[console]' \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 agentstate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin agentstate
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
# 50061: the agent service. The state service listens on 127.0.0.1:50051 inside its pod
# and is not published.
EXPOSE 50061
CMD ["agentstate-agent"]
