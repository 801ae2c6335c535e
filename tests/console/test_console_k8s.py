"""The optional console overlay (k8s/overlays/demo-console), checked offline like the rest
of k8s/ (tests/deploy/test_k8s.py): rendered with kubectl, validated strictly, settings and
addresses cross-checked against what the console and its sidecar read."""

from __future__ import annotations

import copy
import re

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from agentstate.console.config import ConsoleSettings
from agentstate.state_service.config import StateServiceSettings
from tests.deploy.test_k8s import (
    DEMO_OVERLAY,
    MIN_KUBERNETES,
    REPO,
    Obj,
    container_env,
    find,
    pod_spec,
    secret_values,
    split_address,
)
from tests.support.kustomize import render

CONSOLE_OVERLAY = REPO / "k8s" / "overlays" / "demo-console"


@pytest.fixture(scope="module")
def rendered() -> tuple[list[Obj], list[Obj]]:
    return render(DEMO_OVERLAY), render(CONSOLE_OVERLAY)


def _console_objects(resources: list[Obj]) -> list[Obj]:
    return [r for r in resources if r["metadata"]["name"] == "console"]


def test_the_overlay_adds_the_console_and_changes_nothing_else(
    rendered: tuple[list[Obj], list[Obj]],
) -> None:
    demo, with_console = rendered
    added = _console_objects(with_console)
    assert sorted(r["kind"] for r in added) == ["Deployment", "Service"]
    assert [r for r in with_console if r not in added] == demo
    assert all(r["metadata"]["namespace"] == "agentstate" for r in added)


@pytest.mark.parametrize("version", [MIN_KUBERNETES, "latest"])
def test_console_objects_validate_strictly(
    rendered: tuple[list[Obj], list[Obj]], version: str
) -> None:
    if version == "latest":
        version = kubernetes_validate.latest_version()
    for resource in _console_objects(rendered[1]):
        kubernetes_validate.validate(resource, version, strict=True)


def test_console_reaches_the_agent_service_and_its_own_read_only_sidecar(
    rendered: tuple[list[Obj], list[Obj]],
) -> None:
    resources = rendered[1]
    secrets = secret_values(resources)
    spec = pod_spec(resources, "Deployment", "console")
    (sidecar,) = spec["initContainers"]
    (console,) = spec["containers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["command"] == [
        "agentstate-state",
        "serve",
    ]
    state_env = container_env(sidecar, resources, secrets, "console-0")
    console_env = container_env(console, resources, secrets, "console-0")
    # Exactly the variables the two programs declare, and values they accept.
    assert set(console_env) <= set(ConsoleSettings.variables()), console_env
    settings = ConsoleSettings.from_env(console_env)
    state_settings = StateServiceSettings.from_env(state_env)
    assert state_settings.retention_days == 0  # the agent pods' sidecars sweep
    assert settings.state_address == state_settings.listen_address
    assert split_address(state_settings.listen_address)[0] == "127.0.0.1"  # never outside the pod
    host, port = split_address(settings.agent_address)
    agent_service = find(resources, "Service", host)
    assert port in [p["port"] for p in agent_service["spec"]["ports"]]
    assert settings.user_header == "X-Forwarded-User" and not settings.dev_user
    # The Service and the probes target the console's port; /healthz is served by the app.
    listen_port = split_address(settings.listen_address)[1]
    (http,) = console["ports"]
    assert http["containerPort"] == listen_port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert console[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = find(resources, "Service", "console")
    assert (
        service["spec"]["selector"]
        == find(resources, "Deployment", "console")["spec"]["selector"]["matchLabels"]
    )
    # Same sidecar as the agent pod's, apart from resources, probes and retention.
    (agent_sidecar,) = pod_spec(resources, "Deployment", "agent")["initContainers"]
    strip = ("resources", "livenessProbe", "readinessProbe", "env")
    ours, theirs = copy.deepcopy(sidecar), copy.deepcopy(agent_sidecar)
    for key in strip:
        ours.pop(key, None)
        theirs.pop(key, None)
    assert ours == theirs


def test_the_image_has_the_console() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.findall(r"pip install .*'(\.\[\w+\])'", dockerfile) == [".[console]"]
