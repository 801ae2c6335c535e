"""Scaling manifests, checked offline: the ha overlay's PgBouncer Pooler and the central
state service overlay (k8s/overlays/central), with the connection budget as arithmetic.

The Pooler validates against tests/deploy/schemas/cnpg-pooler-v1.subset.schema.json (a
hand-written subset, like the Cluster's); every built-in kind of the central overlay
validates strictly against the Kubernetes schemas. docs/scaling.md explains the numbers.
"""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from agentstate.agent_service.config import AgentServiceSettings
from agentstate.client.service_config import service_config_json
from agentstate.state_service.config import StateServiceSettings
from tests.deploy.test_k8s import (
    MIN_KUBERNETES,
    agent_pod_containers,
    container_env,
    find,
    pod_spec,
    secret_values,
    spec_labels,
)
from tests.support import paths
from tests.support.kustomize import REPO, render

Obj = dict[str, Any]
POOLER = "agentstate-pooler-rw"
CLUSTER = "agentstate-pg"
POOLER_SCHEMA = paths.TESTS / "deploy" / "schemas" / "cnpg-pooler-v1.subset.schema.json"
SUPERUSER_RESERVED = 3  # PostgreSQL's default superuser_reserved_connections
POSTGRES_DEFAULT_MAX_CONNECTIONS = 100  # the base's postgres:15 image sets none


@pytest.fixture(scope="module")
def ha() -> list[Obj]:
    return render(REPO / "k8s" / "overlays" / "ha")


@pytest.fixture(scope="module")
def central() -> list[Obj]:
    return render(REPO / "k8s" / "overlays" / "central")


def pooler_errors(pooler: Obj) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(POOLER_SCHEMA.read_text()))
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(pooler)]


def state_env_of_agent_pod(resources: list[Obj]) -> dict[str, str]:
    secrets = {**secret_values(resources), (f"{CLUSTER}-app", "password"): "from-the-operator"}
    return container_env(agent_pod_containers(resources)["state"], resources, secrets)


# ---------------------------------------------------------------- ha: the Pooler


def test_pooler_is_pgbouncer_in_transaction_mode_on_the_primary(ha: list[Obj]) -> None:
    pooler = find(ha, "Pooler", POOLER)
    assert not pooler_errors(pooler)
    spec = pooler["spec"]
    assert spec["cluster"]["name"] == CLUSTER and spec["type"] == "rw"
    assert spec["pgbouncer"]["poolMode"] == "transaction"
    assert spec["instances"] >= 2  # one PgBouncer pod may go without cutting the RPCs off


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p["spec"]["pgbouncer"].update(poolMode="statement"),
        lambda p: p["spec"]["pgbouncer"]["parameters"].update(default_pool_size=40),
        lambda p: p["spec"].update(instance=2),
    ],
    ids=["bad-pool-mode", "parameter-not-string", "unknown-field"],
)
def test_the_pooler_schema_rejects_mistakes(ha: list[Obj], mutate: Any) -> None:
    broken = copy.deepcopy(find(ha, "Pooler", POOLER))
    mutate(broken)
    assert pooler_errors(broken)


def test_sidecar_uses_the_pooler_and_migrates_directly(ha: list[Obj]) -> None:
    env = state_env_of_agent_pod(ha)
    rpc = urlsplit(env["DATABASE_URL"])
    migrations = urlsplit(env["STATE_MIGRATION_DATABASE_URL"])
    assert (rpc.hostname, rpc.port) == (POOLER, 5432)
    assert (migrations.hostname, migrations.port) == (f"{CLUSTER}-rw", 5432)
    assert rpc.path == migrations.path and rpc.username == migrations.username
    # PgBouncer in transaction mode: no server-side prepared statements.
    settings = StateServiceSettings.from_env(env)
    assert settings.db_prepared_statements == "off"
    assert settings.migration_database_url == env["STATE_MIGRATION_DATABASE_URL"]


def test_the_pooler_reaches_the_cluster_and_agents_reach_the_pooler(ha: list[Obj]) -> None:
    cluster_policy = find(ha, "NetworkPolicy", CLUSTER)["spec"]
    sources = [s for rule in cluster_policy["ingress"] for s in rule["from"]]
    assert {"podSelector": {"matchLabels": {"cnpg.io/poolerName": POOLER}}} in sources
    pooler_policy = find(ha, "NetworkPolicy", "agentstate-pooler")["spec"]
    assert pooler_policy["podSelector"]["matchLabels"] == {"cnpg.io/poolerName": POOLER}
    agent_labels = spec_labels(ha, "Deployment", "agent")
    from_agents = [
        {p["port"] for p in rule["ports"]}
        for rule in pooler_policy["ingress"]
        for source in rule["from"]
        if "namespaceSelector" not in source
        and source["podSelector"]["matchLabels"].items() <= agent_labels.items()
    ]
    assert from_agents == [{5432}]


def test_ha_connection_budget(ha: list[Obj]) -> None:
    """agent pods x (pool + watcher) <= max_client_conn; pooler instances x server pool
    <= max_connections - reserved, with room left for migrations."""
    pooler = find(ha, "Pooler", POOLER)["spec"]
    params = pooler["pgbouncer"]["parameters"]
    cluster = find(ha, "Cluster", CLUSTER)["spec"]
    max_connections = int(cluster["postgresql"]["parameters"]["max_connections"])
    settings = StateServiceSettings.from_env(state_env_of_agent_pod(ha))
    pods = find(ha, "Deployment", "agent")["spec"]["replicas"]
    per_pod = settings.pool_max_size + 1
    # Either pooler instance must take every client if the other is gone.
    assert pods * per_pod <= int(params["max_client_conn"])
    server_side = pooler["instances"] * int(params["max_db_connections"])
    assert server_side <= max_connections - SUPERUSER_RESERVED
    # Direct connections: one migrator per starting pod, plus the operator's own.
    assert server_side + pods <= max_connections - SUPERUSER_RESERVED - 10
    # The pooler is what lets pods grow past the server: how many pods fit.
    assert int(params["max_client_conn"]) // per_pod > (max_connections // per_pod)


# ------------------------------------------------------- central: the state service


def test_central_overlay_validates_strictly(central: list[Obj]) -> None:
    kinds = {(r["kind"], r["metadata"]["name"]) for r in central}
    for expected in [
        ("Deployment", "state"),
        ("Service", "state"),
        ("NetworkPolicy", "state"),
        ("PodDisruptionBudget", "state"),
        ("HorizontalPodAutoscaler", "state"),
    ]:
        assert expected in kinds
    errors = []
    for version in (MIN_KUBERNETES, kubernetes_validate.latest_version()):
        for resource in central:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{resource['kind']}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_agents_call_the_headless_service_by_dns_with_round_robin(central: list[Obj]) -> None:
    spec = pod_spec(central, "Deployment", "agent")
    assert not spec.get("initContainers"), "the sidecar is gone in the central topology"
    [agent] = spec["containers"]
    env = container_env(agent, central, secret_values(central))
    settings = AgentServiceSettings.from_env(env)
    target = settings.state_address
    assert target.startswith("dns:///"), target
    host, port = target.removeprefix("dns:///").rsplit(":", 1)
    service = find(central, "Service", "state")
    assert host == f"state.{service['metadata']['namespace']}.svc.cluster.local"
    assert service["spec"]["clusterIP"] == "None"  # headless: DNS returns every pod
    [service_port] = service["spec"]["ports"]
    assert int(port) == service_port["port"]
    assert (
        service["spec"]["selector"].items() <= spec_labels(central, "Deployment", "state").items()
    )
    config = json.loads(service_config_json())
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]


def test_central_state_pods_listen_for_agents_only(central: list[Obj]) -> None:
    [state] = pod_spec(central, "Deployment", "state")["containers"]
    env = container_env(state, central, secret_values(central))
    settings = StateServiceSettings.from_env(env)
    assert settings.listen_address == "0.0.0.0:50051" and settings.store == "postgres"
    # Agents re-resolve the name (and find replicas the HPA added) as connections recycle.
    assert 0 < settings.grpc_max_connection_age_seconds <= 600
    [port] = state["ports"]
    assert port["containerPort"] == 50051
    assert state["readinessProbe"]["grpc"] == {
        "port": 50051,
        "service": "agentstate.state.v1.StateService",
    }
    assert "tcpSocket" in state["livenessProbe"]  # a database outage never restarts it
    policy = find(central, "NetworkPolicy", "state")["spec"]
    [rule] = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "agent"}}}]
    assert [p["port"] for p in rule["ports"]] == [50051]
    # PostgreSQL now admits the state pods, and no longer the agents.
    pg = find(central, "NetworkPolicy", "postgres")["spec"]
    sources = [s["podSelector"]["matchLabels"] for r in pg["ingress"] for s in r["from"]]
    assert sources == [{"app.kubernetes.io/name": "state"}]


def test_central_disruption_budget_autoscaler_and_connection_budget(central: list[Obj]) -> None:
    deployment = find(central, "Deployment", "state")
    pdb = find(central, "PodDisruptionBudget", "state")["spec"]
    assert pdb["maxUnavailable"] == 1 and deployment["spec"]["replicas"] >= 2
    assert (
        pdb["selector"]["matchLabels"].items()
        <= spec_labels(central, "Deployment", "state").items()
    )
    hpa = find(central, "HorizontalPodAutoscaler", "state")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "state"}
    assert hpa["minReplicas"] >= 2 and hpa["minReplicas"] <= deployment["spec"]["replicas"]
    [state] = pod_spec(central, "Deployment", "state")["containers"]
    assert state["resources"]["requests"]["cpu"]  # utilisation needs a request
    settings = StateServiceSettings.from_env(container_env(state, central, secret_values(central)))
    # replicas x (pool + watcher) <= max_connections - reserved, at the HPA's maximum.
    assert hpa["maxReplicas"] * (settings.pool_max_size + 1) <= (
        POSTGRES_DEFAULT_MAX_CONNECTIONS - SUPERUSER_RESERVED
    )
