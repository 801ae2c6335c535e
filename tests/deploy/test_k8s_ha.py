"""k8s/overlays/ha, checked offline: the base with a 3-instance CloudNativePG cluster.

What is validated: the overlay renders with kustomize; every built-in kind validates
strictly against the Kubernetes schemas (kubernetes-validate), as the base does; the
CloudNativePG Cluster validates against tests/deploy/schemas/cnpg-cluster-v1.subset.schema.json,
a hand-written schema of exactly the fields the overlay uses (types, enums and bounds from
the operator's CRD; any other field fails), and its resources against the core schema;
the wiring is cross-checked (the sidecar's URL names the cluster's read-write Service,
database and owner; the password comes from the operator's app Secret). What is not: the
CRD's CEL rules, the operator's admission webhook, and anything a running operator does.
"""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import psycopg.conninfo
import pytest

from tests.deploy.test_k8s import (
    MIN_KUBERNETES,
    agent_pod_containers,
    container_env,
    find,
    otel_sdk_variables,
    pod_spec,
    secret_values,
    spec_labels,
    variables_read,
)
from tests.support import paths
from tests.support.kustomize import REPO, render

Obj = dict[str, Any]

OVERLAY = REPO / "k8s" / "overlays" / "ha"
SCHEMA = paths.TESTS / "deploy" / "schemas" / "cnpg-cluster-v1.subset.schema.json"
CLUSTER = "agentstate-pg"
APP_SECRET = f"{CLUSTER}-app"  # created by the operator for bootstrap.initdb's owner
REMOVED = {
    ("StatefulSet", "postgres"),
    ("Service", "postgres"),
    ("NetworkPolicy", "postgres"),
    ("Secret", "agentstate-db"),
}
ADDED = {
    ("Cluster", CLUSTER),
    ("NetworkPolicy", CLUSTER),
    ("Pooler", "agentstate-pooler-rw"),  # tests/deploy/test_k8s_scaling.py checks it
    ("NetworkPolicy", "agentstate-pooler"),
}
# Read by libpq itself, not by the services' settings.
LIBPQ_VARIABLES = {"PGPASSWORD"}


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render(REPO / "k8s")


@pytest.fixture(scope="module")
def ha() -> list[Obj]:
    return render(OVERLAY)


@pytest.fixture(scope="module")
def cluster(ha: list[Obj]) -> Obj:
    return find(ha, "Cluster", CLUSTER)


def kinds(resources: list[Obj]) -> set[tuple[str, str]]:
    return {(r["kind"], r["metadata"]["name"]) for r in resources}


def cluster_errors(cluster: Obj) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    return [
        f"{'.'.join(str(p) for p in error.path)}: {error.message}"
        for error in validator.iter_errors(cluster)
    ]


def test_overlay_replaces_the_single_postgres_with_a_cluster(
    base: list[Obj], ha: list[Obj]
) -> None:
    assert kinds(ha) == (kinds(base) - REMOVED) | ADDED
    for resource in ha:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "agentstate", resource["metadata"]
    # Nothing left refers to the removed Secret.
    assert "agentstate-db" not in json.dumps(ha)


@pytest.mark.parametrize("version", [MIN_KUBERNETES, "latest"])
def test_built_in_kinds_validate_strictly(ha: list[Obj], version: str) -> None:
    if version == "latest":
        version = kubernetes_validate.latest_version()
    errors = []
    for resource in ha:
        if resource["apiVersion"] == "postgresql.cnpg.io/v1":
            continue  # no schema in kubernetes-validate: see test_cluster_matches_its_schema
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{resource['kind']}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_cluster_matches_its_schema(cluster: Obj) -> None:
    assert not cluster_errors(cluster)
    # The pod resources are Kubernetes' own ResourceRequirements: check them with its schema.
    probe_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "resources-check"},
        "spec": {
            "containers": [{"name": "c", "image": "i", "resources": cluster["spec"]["resources"]}]
        },
    }
    kubernetes_validate.validate(probe_pod, MIN_KUBERNETES, strict=True)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["spec"].update(instance=3),  # a typo
        lambda c: c["spec"]["postgresql"]["synchronous"].update(method="all"),
        lambda c: c["spec"]["postgresql"]["synchronous"].update(number=0),
        lambda c: c["spec"]["postgresql"]["parameters"].update(max_connections=200),
        lambda c: c["spec"]["storage"].update(size="ten gigs"),
    ],
    ids=["unknown-field", "bad-enum", "below-minimum", "parameter-not-string", "bad-size"],
)
def test_the_schema_rejects_mistakes(cluster: Obj, mutate: Any) -> None:
    broken = copy.deepcopy(cluster)
    mutate(broken)
    assert cluster_errors(broken)


def test_cluster_is_three_instances_with_synchronous_replication(
    base: list[Obj], cluster: Obj
) -> None:
    spec = cluster["spec"]
    assert spec["instances"] == 3
    synchronous = spec["postgresql"]["synchronous"]
    # At least one standby confirms every commit, and with none available commits wait
    # rather than go asynchronous: an acknowledged write is always on two instances.
    assert 1 <= synchronous["number"] < spec["instances"]
    assert synchronous["dataDurability"] == "required"
    assert spec["failoverDelay"] == 0
    assert spec["affinity"]["enablePodAntiAffinity"] is True
    # The PostgreSQL major version of the base (postgres:15), which the tests run on.
    [base_pg] = pod_spec(base, "StatefulSet", "postgres")["containers"]
    assert spec["imageName"].rsplit(":", 1)[1].split(".")[0] == "15"
    assert base_pg["image"].split(":")[1].split(".")[0] == "15"


def test_agent_pod_uses_the_read_write_service(
    base: list[Obj], ha: list[Obj], cluster: Obj
) -> None:
    initdb = cluster["spec"]["bootstrap"]["initdb"]
    # The operator's app Secret exists only in a running cluster: stand in for it.
    secrets = {**secret_values(ha), (APP_SECRET, "password"): "from-the-operator"}
    read = variables_read()
    otel = otel_sdk_variables()
    containers = agent_pod_containers(ha)
    # The product agent (no profile) has no database of its own: only the sidecar's.
    assert not any("DATABASE_URL" in v["name"] for v in containers["agent"].get("env", []))
    # Migrations go straight to the primary; the RPCs through the Pooler
    # (tests/deploy/test_k8s_scaling.py).
    for service, variable in [("state", "STATE_MIGRATION_DATABASE_URL")]:
        container = containers[service]
        env = container_env(container, ha, secrets)
        url = env[variable]
        parts = urlsplit(url)
        assert (parts.hostname, parts.port) == (f"{CLUSTER}-rw", 5432), url
        assert parts.username == initdb["owner"] and parts.path == f"/{initdb['database']}"
        assert parts.password is None, "the password stays in the Secret"
        assert parse_qs(parts.query)["target_session_attrs"] == ["read-write"]
        params = psycopg.conninfo.conninfo_to_dict(url)  # libpq's own parser accepts it
        assert params["target_session_attrs"] == "read-write"
        [password] = [v for v in container["env"] if v["name"] == "PGPASSWORD"]
        assert password["valueFrom"]["secretKeyRef"] == {"name": APP_SECRET, "key": "password"}
        # Every variable is one the service or libpq reads.
        unknown = set(env) - read[service] - otel - LIBPQ_VARIABLES
        assert not unknown, f"{service}: set but never read: {sorted(unknown)}"

    # Apart from the database variables the agent pod is the base's, probes included.
    def without_database_env(spec: Obj) -> Obj:
        spec = copy.deepcopy(spec)
        for container in [*spec["initContainers"], *spec["containers"]]:
            container["env"] = sorted(
                (
                    v
                    for v in container.get("env", [])
                    if "DATABASE_URL" not in v["name"]
                    and v["name"] not in LIBPQ_VARIABLES
                    and v["name"] != "STATE_DB_PREPARED_STATEMENTS"
                ),
                key=lambda v: v["name"],
            )
        return spec

    assert without_database_env(pod_spec(ha, "Deployment", "agent")) == without_database_env(
        pod_spec(base, "Deployment", "agent")
    )


def test_only_agent_pods_and_the_operator_reach_the_cluster(ha: list[Obj]) -> None:
    policy = find(ha, "NetworkPolicy", CLUSTER)["spec"]
    assert policy["podSelector"]["matchLabels"] == {"cnpg.io/cluster": CLUSTER}
    agent_labels = spec_labels(ha, "Deployment", "agent")
    rules = policy["ingress"]
    ports_from_agents = [
        {p["port"] for p in rule["ports"]}
        for rule in rules
        for source in rule["from"]
        if "namespaceSelector" not in source
        and source["podSelector"]["matchLabels"].items() <= agent_labels.items()
    ]
    assert ports_from_agents == [{5432}]  # migrations; the RPCs come through the Pooler
    operator = [
        {p["port"] for p in rule["ports"]}
        for rule in rules
        for source in rule["from"]
        if source.get("namespaceSelector", {}).get("matchLabels")
        == {"kubernetes.io/metadata.name": "cnpg-system"}
    ]
    assert operator == [{8000, 5432}]
