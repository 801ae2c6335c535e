"""k8s/overlays/central-tls, rendered and checked offline: cert-manager issues the state
service and the agents certificates from one private CA; the state pods serve TLS from
those files, require client certificates and apply the policy; the agents present theirs;
the probes speak TLS. The cert-manager objects validate against
tests/deploy/schemas/cert-manager-v1.subset.schema.json (hand-written, like the CNPG
ones), every built-in kind strictly against the Kubernetes schemas."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.server import state_security
from agentstate.state_service.config import StateServiceSettings
from agentstate.state_service.policy import READ_RPCS, WRITE_RPCS, Caller, load_policy
from agentstate.state_service.server import caller_interceptor
from tests.deploy.test_k8s import MIN_KUBERNETES, container_env, find, pod_spec, secret_values
from tests.support import paths
from tests.support.kustomize import REPO, render

Obj = dict[str, Any]
SCHEMA = paths.TESTS / "deploy" / "schemas" / "cert-manager-v1.subset.schema.json"
CERT_MANAGER = "cert-manager.io/v1"


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return render(REPO / "k8s" / "overlays" / "central-tls")


def _mounted(spec: Obj, container: Obj, path: str) -> Obj:
    """The volume whose mount holds `path`, and the key within it."""
    for mount in container.get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            assert mount.get("readOnly") is True, mount
            return {"volume": volume, "key": path[len(mount["mountPath"]) :].lstrip("/")}
    raise AssertionError(f"{path} is on no volume of {container['name']}")


def test_every_object_validates(rendered: list[Obj]) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    errors = []
    for resource in rendered:
        if resource["apiVersion"] == CERT_MANAGER:
            errors += [f"{resource['kind']}: {e.message}" for e in validator.iter_errors(resource)]
            continue
        for version in (MIN_KUBERNETES, kubernetes_validate.latest_version()):
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{resource['kind']}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["spec"].update(usages=["client authentication"]),
        lambda c: c["spec"]["privateKey"].update(rotationPolicy="Sometimes"),
        lambda c: c["spec"].update(secretname="x"),
        lambda c: c["spec"].update(duration="90d"),
    ],
)
def test_the_schema_rejects_mistakes(rendered: list[Obj], mutate: Any) -> None:
    certificate = copy.deepcopy(find(rendered, "Certificate", "state-tls"))
    mutate(certificate)
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    assert list(validator.iter_errors(certificate))


def test_the_chain_of_issuers(rendered: list[Obj]) -> None:
    ca = find(rendered, "Certificate", "agentstate-ca")["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "agentstate-selfsigned"
    assert find(rendered, "Issuer", "agentstate-ca")["spec"]["ca"]["secretName"] == ca["secretName"]
    for name in ("state-tls", "agent-tls"):
        spec = find(rendered, "Certificate", name)["spec"]
        assert spec["issuerRef"] == {"name": "agentstate-ca", "kind": "Issuer"}
        assert spec["privateKey"]["rotationPolicy"] == "Always"
        # Renewed well before expiry: the state service reloads it without a restart.
        assert int(spec["renewBefore"].rstrip("h")) >= int(spec["duration"].rstrip("h")) // 4


def test_state_pods_serve_mtls_with_the_policy(rendered: list[Obj], tmp_path: Path) -> None:
    spec = pod_spec(rendered, "Deployment", "state")
    [state] = spec["containers"]
    env = container_env(state, rendered, secret_values(rendered))
    certificate = find(rendered, "Certificate", "state-tls")["spec"]
    for variable, key in [
        ("STATE_TLS_CERT_FILE", "tls.crt"),
        ("STATE_TLS_KEY_FILE", "tls.key"),
        ("STATE_TLS_CLIENT_CA_FILE", "ca.crt"),  # the CA Issuer writes its CA here
    ]:
        where = _mounted(spec, state, env[variable])
        assert where == {
            "volume": {"name": "tls", "secret": {"secretName": "state-tls"}},
            "key": key,
        }
    assert certificate["secretName"] == "state-tls"
    # The agents dial the headless Service's name: it is in the certificate.
    agent = pod_spec(rendered, "Deployment", "agent")["containers"][0]
    agent_env = container_env(agent, rendered, secret_values(rendered))
    target = agent_env["AGENT_STATE_ADDRESS"].removeprefix("dns:///").rsplit(":", 1)[0]
    assert target in certificate["dnsNames"]
    # The policy is the generated ConfigMap, mounted where STATE_POLICY_FILE points.
    where = _mounted(spec, state, env["STATE_POLICY_FILE"])
    config_map = find(rendered, "ConfigMap", where["volume"]["configMap"]["name"])
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(config_map["data"][where["key"]])
    policy = load_policy(str(policy_file), READ_RPCS | WRITE_RPCS)
    # The agent's certificate names the caller the policy lets read and write, not erase.
    [agent_id] = find(rendered, "Certificate", "agent-tls")["spec"]["uris"]
    assert policy.allows(Caller(agent_id, "mtls"), "EndTurn", "anyone")
    assert not policy.allows(Caller(agent_id, "mtls"), "EraseUser", None)
    assert policy.allows(Caller("agentstate-operator", "mtls"), "EraseUser", None)
    # The service would start with these settings (the policy read from the file).
    settings = StateServiceSettings.from_env({**env, "STATE_POLICY_FILE": str(policy_file)})
    assert caller_interceptor(settings).policy == policy
    # Probes: Kubernetes' gRPC probe has no TLS; the exec probe checks the certificate
    # for the name the agents use.
    for probe in ("startupProbe", "readinessProbe"):
        command = state[probe]["exec"]["command"]
        assert command[:2] == ["agentstate-state", "health"] and "grpc" not in state[probe]
        assert f"--server-name={target}" in command
        assert f"--ca-file={env['STATE_TLS_CLIENT_CA_FILE']}" in command
    assert "client auth" in certificate["usages"]  # the probe presents it under mTLS


def test_agents_present_their_certificate(rendered: list[Obj]) -> None:
    spec = pod_spec(rendered, "Deployment", "agent")
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    env = container_env(agent, rendered, secret_values(rendered))
    for variable, key in [
        ("AGENT_STATE_TLS_CA_FILE", "ca.crt"),
        ("AGENT_STATE_TLS_CERT_FILE", "tls.crt"),
        ("AGENT_STATE_TLS_KEY_FILE", "tls.key"),
    ]:
        where = _mounted(spec, agent, env[variable])
        assert where["volume"]["secret"] == {"secretName": "agent-tls"} and where["key"] == key
    assert find(rendered, "Certificate", "agent-tls")["spec"]["usages"] == ["client auth"]
    settings = AgentServiceSettings.from_env(env)
    assert settings.state_tls_cert_file and settings.state_tls_ca_file
    with pytest.raises(Exception, match="cannot be read"):
        state_security(settings)  # the files exist only in the pod: the settings are used
