"""The Kubernetes manifests (deploy/kubernetes/): every document validates against its
kind's upstream JSON schema — the built-in kinds against the Kubernetes 1.33 strict
schemas, ServiceMonitor and PrometheusRule against prometheus-operator's CRDs, vendored in
tests/fixtures/k8s (SOURCES.md) — strictly (an unknown field is an error, as with
`kubectl apply --validate=strict`); the generated ones are current; the pieces fit each
other (selectors, ports, names, probes on canaryd's endpoints); and the ConfigMap's
canaryd.toml loads as the daemon in the pod would load it."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

from canaryd.config import load_settings
from canaryd.server.app import RESERVED_PATHS
from tests.packaging.test_delivery_examples import strict

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
SCHEMAS = REPO / "tests" / "fixtures" / "k8s"
RULES = REPO / "grafana" / "alerts" / "canaryd.rules.yml"
# (apiVersion, kind) -> the vendored schema
BUILT_IN = {
    ("v1", "Namespace"): "namespace-v1.json",
    ("v1", "ServiceAccount"): "serviceaccount-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("v1", "Secret"): "secret-v1.json",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaim-v1.json",
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicy-networking-v1.json",
}
CRDS = {
    "ServiceMonitor": "servicemonitor.schema.json",
    "PrometheusRule": "prometheusrule.schema.json",
}
NOT_APPLIED = {"kustomization.yaml", "secret.example.yaml", "grafana-dashboard-history.yaml"}


def deploy_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "deploy_generate", REPO / "deploy" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for document in yaml.safe_load_all(path.read_text()):
                yield path.name, document


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [
        d for _, d in documents() if d["kind"] == kind and name in (None, d["metadata"]["name"])
    ]
    return found


def built_in_validator(file: str) -> jsonschema.protocols.Validator:
    definitions = json.loads((SCHEMAS / "_definitions.json").read_text())
    schema = json.loads((SCHEMAS / file).read_text())
    registry: Registry[Any] = Registry().with_resource(
        definitions["$id"], Resource.from_contents(definitions)
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(document: dict[str, Any]) -> None:
    key = (document["apiVersion"], document["kind"])
    if key in BUILT_IN:
        built_in_validator(BUILT_IN[key]).validate(document)
        return
    crd = json.loads((SCHEMAS / CRDS[document["kind"]]).read_text())
    assert document["apiVersion"] == f"{crd['group']}/{crd['version']}"
    jsonschema.Draft7Validator(strict(crd["openAPIV3Schema"])).validate(document)


class TestSchemas:
    def test_every_manifest_validates_against_its_upstream_schema(self) -> None:
        kinds = set()
        for name, document in documents():
            try:
                validate(document)
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{name}: {exc.message} at {list(exc.absolute_path)}")
            kinds.add(document["kind"])
        assert kinds == {kind for _, kind in BUILT_IN} | set(CRDS)

    def test_the_schemas_refuse_what_kubernetes_refuses(self) -> None:
        """The validation can fail: an unknown field, a wrong type and a bad CRD field
        are each refused."""
        deployment = one("Deployment")
        typo = json.loads(json.dumps(deployment))
        typo["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
        wrong = json.loads(json.dumps(deployment))
        wrong["spec"]["replicas"] = "one"
        monitor = json.loads(json.dumps(one("ServiceMonitor")))
        monitor["spec"]["endpoints"][0]["scrapeEvery"] = "30s"
        for bad in (typo, wrong, monitor):
            with pytest.raises(jsonschema.ValidationError):
                validate(bad)


class TestKustomization:
    def test_lists_every_manifest_but_the_examples(self) -> None:
        kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
        files = {p.name for p in MANIFESTS.glob("*.yaml")}
        assert set(kustomization["resources"]) == files - NOT_APPLIED
        assert kustomization["namespace"] == one("Namespace")["metadata"]["name"]
        image = one("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.split(":")[0] in {i["name"] for i in kustomization["images"]}


class TestGenerated:
    def test_generated_manifests_are_current(self, tmp_path: Path) -> None:
        """prometheusrule.yaml, the dashboard ConfigMaps and the kustomize components' copies
        of docs/examples are what deploy/generate.py writes; `--check` fails on a stale
        copy."""
        module = deploy_generator()
        for name, text in module.outputs().items():
            assert (DEPLOY / name).read_text() == text, f"{name} is stale: deploy/generate.py"
        assert module.main(["--check"]) == 0
        assert module.main(["--check", "--out-dir", str(tmp_path)]) == 1

    def test_the_prometheus_rule_is_the_promtool_tested_rules(self) -> None:
        rule = one("PrometheusRule")
        assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]

    def test_dashboards_are_configmaps_for_the_grafana_sidecar(self) -> None:
        boards = REPO / "grafana" / "dashboards"
        maps = [
            d
            for _, d in documents()
            if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {})
        ]
        assert {key for m in maps for key in m["data"]} == {p.name for p in boards.glob("*.json")}
        for configmap in maps:
            assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
            for key, text in configmap["data"].items():
                assert text == (boards / key).read_text()
                json.loads(text)


def container() -> dict[str, Any]:
    (found,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return found


def env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in container()["env"] if "value" in e}


class TestFit:
    def test_probes_hit_canaryd_endpoints_on_the_listening_port(self) -> None:
        c = container()
        (port,) = c["ports"]
        assert env()["CANARYD_SERVER__LISTEN"] == f"0.0.0.0:{port['containerPort']}"
        assert port["containerPort"] == 9466
        paths = {}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["port"] == port["name"], probe
            paths[probe] = c[probe]["httpGet"]["path"]
        assert paths == {
            "startupProbe": "/healthz",
            "livenessProbe": "/healthz",
            "readinessProbe": "/readyz",
        }
        assert {"/healthz", "/readyz"} <= set(RESERVED_PATHS)

    def test_runs_unprivileged_on_a_read_only_root(self) -> None:
        pod = one("Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        context = container()["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        resources = container()["resources"]
        assert resources["requests"]["cpu"] and resources["requests"]["memory"]
        assert resources["limits"]["memory"]

    def test_volumes_config_and_secret_are_wired(self) -> None:
        pod = one("Deployment")["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container()["volumeMounts"]}
        data_dir = env()["CANARYD_DATA_DIR"]
        claim = volumes[mounts[data_dir]]["persistentVolumeClaim"]["claimName"]
        assert claim == one("PersistentVolumeClaim")["metadata"]["name"]
        config = Path(env()["CANARYD_CONFIG"])
        assert volumes[mounts[str(config.parent)]]["configMap"]["name"] == "canaryd"
        assert config.name in one("ConfigMap", "canaryd")["data"]
        assert "/tmp" in mounts  # the one other writable path
        (source,) = container()["envFrom"]
        assert source["secretRef"]["name"] == one("Secret")["metadata"]["name"]
        assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]

    def test_service_monitor_and_policy_select_the_pod(self) -> None:
        deployment, service = one("Deployment"), one("Service")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        assert service["spec"]["selector"].items() <= pod_labels.items()
        (port,) = service["spec"]["ports"]
        assert port["port"] == 9466 and port["targetPort"] == container()["ports"][0]["name"]
        monitor = one("ServiceMonitor")
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        policy = one("NetworkPolicy")
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [port["name"]]


class TestConfig:
    def test_the_configmap_loads_as_the_pod_loads_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """canaryd.toml with the Deployment's environment and the example Secret: remote
        arms, the listen address probes reach, history and switch file on the volume."""
        text = one("ConfigMap", "canaryd")["data"]["canaryd.toml"]
        path = tmp_path / "canaryd.toml"
        path.write_text(text)
        for name, value in {**env(), **one("Secret")["stringData"]}.items():
            monkeypatch.setenv(name, value)
        settings = load_settings(path)
        data_dir = env()["CANARYD_DATA_DIR"]
        assert settings.server.listen == "0.0.0.0:9466"
        assert settings.server.auth_token is not None
        assert settings.storage.url == f"sqlite:///{data_dir}/canaryd.db"
        assert str(settings.switch.resolved_state_file()).startswith(data_dir)
        assert {settings.arms.arm(n).kind for n in settings.arms.names} == {"openai"}
        # The commented sink: enabled, its hash key comes from the Secret.
        sink = text.replace(
            '# [traffic]\n# listen = "0.0.0.0:9467"', '[traffic]\nlisten = "0.0.0.0:9467"'
        )
        assert sink != text
        path.write_text(sink)
        assert load_settings(path).traffic.hash_key is not None
