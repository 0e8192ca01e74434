"""deploy/kustomize: the base and each overlay render (tests/support/kustomize.py, which
agrees with `kubectl kustomize` where kubectl is installed) into objects that validate
against their kinds' schemas; each overlay's pod loads its configuration with the Secrets
docs/kubernetes.md's quick start creates; and the NetworkPolicies admit every flow of
that guide's table and close a component's flows without it, each of their rules is a
row, flows off the table are refused, and every address canaryd's configuration calls or
listens on is a row of the table."""

from __future__ import annotations

import functools
import itertools
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from canaryd.config import load_settings
from canaryd.config.settings import Settings
from tests.packaging import test_delivery_examples, test_kubernetes
from tests.support.kustomize import UnsupportedError, build, identity
from tests.support.networkpolicy import (
    NAMESPACE_LABEL,
    Direction,
    Flow,
    Pod,
    admits,
    admitted_by,
)

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kustomize"
GUIDE = REPO / "docs" / "kubernetes.md"
EXAMPLES = REPO / "docs" / "examples"
RENDERS = {
    "base": KUSTOMIZE / "base",
    **{f"overlays/{p.name}": p for p in sorted((KUSTOMIZE / "overlays").iterdir())},
}
OVERLAYS = [name for name in RENDERS if name != "base"]
CRD_FIXTURES = {"AnalysisTemplate": "argo-analysis-template.schema.json"}
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgresql+psycopg": 5432}
# The namespace each rollout tool calls canaryd from (docs/kubernetes.md's flow table).
ROLLOUT_TOOLS = {"argo": "argo-rollouts", "flagger": "flagger-system"}

Manifest = dict[str, Any]


@functools.cache
def rendered(name: str) -> tuple[Manifest, ...]:
    return tuple(build(RENDERS[name]))


def components(name: str) -> set[str]:
    """`base` and the components an overlay names."""
    kustomization = yaml.safe_load((RENDERS[name] / "kustomization.yaml").read_text())
    return {"base"} | {Path(c).name for c in kustomization.get("components", [])}


def one(objects: tuple[Manifest, ...], kind: str, name: str) -> Manifest:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def policies(name: str) -> list[Manifest]:
    return [o for o in rendered(name) if o["kind"] == "NetworkPolicy"]


def canaryd_pod(name: str) -> Pod:
    template = one(rendered(name), "Deployment", "canaryd")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    namespace = one(rendered(name), "Deployment", "canaryd")["metadata"]["namespace"]
    return Pod(namespace, template["metadata"]["labels"], ports)


# -- the guide: its flow table and its quick start --------------------------------------


@dataclass(frozen=True)
class Row:
    flow: str
    source: Pod | None  # None: canaryd's pod
    destination: Pod | None
    ports: tuple[tuple[int, str], ...]
    component: str
    policies: frozenset[str]

    def flows(self, canaryd: Pod) -> Iterator[tuple[Flow, Direction]]:
        """The row's flows, each with the side canaryd's policies judge it on."""
        for port, protocol in self.ports:
            flow = Flow(self.source or canaryd, self.destination or canaryd, port, protocol)
            yield flow, "Egress" if self.source is None else "Ingress"


def _endpoint(cell: str) -> Pod | None:
    if cell == "canaryd":
        return None
    namespace, *labels = re.findall(r"`([^`]+)`", cell)
    return Pod(namespace, dict(label.split("=", 1) for label in labels))


@functools.cache
def flow_table() -> tuple[Row, ...]:
    """The rows of docs/kubernetes.md's "Network flows" table."""
    text = GUIDE.read_text(encoding="utf-8")
    lines = text[text.index("## Network flows\n") :].splitlines()
    start = lines.index("| flow | from | to | port | component | admitted by |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        flow, source, destination, ports, component, names = (
            cell.strip() for cell in line.strip("|").split(" | ")
        )
        rows.append(
            Row(
                flow=flow,
                source=_endpoint(source),
                destination=_endpoint(destination),
                ports=tuple((int(n), p) for n, p in re.findall(r"(\d+)/(TCP|UDP)", ports)),
                component=component.strip("`"),
                policies=frozenset(re.findall(r"`([^`]+)`", names)),
            )
        )
    return tuple(rows)


@functools.cache
def quick_start() -> tuple[tuple[str, ...], ...]:
    """The quick start's commands, each split as the shell splits it (no expansion)."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text[text.index("```sh\n") + 6 :]
    block = block[: block.index("```")].replace("\\\n", " ")
    return tuple(
        tuple(words) for line in block.splitlines() if (words := shlex.split(line, comments=True))
    )


def created_secrets() -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, name) -> {key: value as written} of each `kubectl create secret`."""
    secrets = {}
    for argv in quick_start():
        if argv[:1] == ("kubectl",) and argv[3:6] == ("create", "secret", "generic"):
            assert argv[1] == "-n", argv
            literals = [a.removeprefix("--from-literal=") for a in argv if "literal=" in a]
            secrets[(argv[2], argv[6])] = dict(a.split("=", 1) for a in literals)
    return secrets


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


# -- the pod's configuration ----------------------------------------------------------


def pod_settings(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings canaryd's container loads: the rendered ConfigMap's canaryd.toml, the
    Deployment's environment and the quick start's Secret (any value for each key)."""
    (container,) = one(rendered(name), "Deployment", "canaryd")["spec"]["template"]["spec"][
        "containers"
    ]
    path = tmp_path / "canaryd.toml"
    path.write_text(one(rendered(name), "ConfigMap", "canaryd")["data"]["canaryd.toml"])
    namespace = canaryd_pod(name).namespace
    for source in container["envFrom"]:
        for key in created_secrets()[(namespace, source["secretRef"]["name"])]:
            monkeypatch.setenv(key, "0" * 64)
    for variable in container["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])
    return load_settings(path)


def _urls(settings: Settings) -> Iterator[tuple[str, str]]:
    for key, value in _walk(settings.model_dump(mode="json")):
        if isinstance(value, str) and "://" in value and not value.startswith("sqlite"):
            yield key, value
        elif isinstance(value, list):
            yield from ((key, v) for v in value if isinstance(v, str) and "://" in v)


def _in_cluster(url: str) -> tuple[str, int]:
    """A Service URL's namespace (`<service>.<namespace>.svc…`) and port."""
    parts = urlsplit(url)
    labels = (parts.hostname or "").split(".")
    assert len(labels) >= 3 and labels[2] == "svc", f"{url}: not a Service in the cluster"
    return labels[1], parts.port or DEFAULT_PORTS[parts.scheme]


def _listen_port(address: str) -> int:
    return int(address.rpartition(":")[2])


# -- tests ----------------------------------------------------------------------------


class TestRender:
    @pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
    @pytest.mark.parametrize("name", [*RENDERS, "deploy/kubernetes"])
    def test_the_renderer_agrees_with_kubectl(self, name: str) -> None:
        """tests/support/kustomize.py renders what `kubectl kustomize` renders."""
        folder = RENDERS.get(name, REPO / name)
        printed = subprocess.run(
            ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True
        ).stdout
        theirs = {identity(o): o for o in yaml.safe_load_all(printed)}
        assert {identity(o): o for o in build(folder)} == theirs

    def test_the_renderer_refuses_what_it_does_not_implement(self, tmp_path: Path) -> None:
        """A kustomization key it does not know is an error, not a silent difference."""
        (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
        with pytest.raises(UnsupportedError, match="namePrefix"):
            build(tmp_path)

    def test_the_base_is_deploy_kubernetes(self) -> None:
        """The overlays start from the manifests the guide applies on their own."""
        assert list(rendered("base")) == build(REPO / "deploy" / "kubernetes")

    @pytest.mark.parametrize("name", list(RENDERS))
    def test_every_object_validates_against_its_schema(self, name: str) -> None:
        """Strictly, as test_kubernetes.py validates deploy/kubernetes."""
        for manifest in rendered(name):
            if manifest["kind"] in CRD_FIXTURES:
                test_delivery_examples.validate(manifest, CRD_FIXTURES[manifest["kind"]])
            else:
                test_kubernetes.validate(manifest)

    def test_every_component_is_in_an_overlay(self) -> None:
        """Each overlay is base + its tool's component + every other feature; no component
        is shipped unrendered."""
        shipped = {p.name for p in (KUSTOMIZE / "components").iterdir()}
        assert set().union(*(components(o) for o in OVERLAYS)) == shipped | {"base"}
        for overlay in OVERLAYS:
            tool = Path(overlay).name
            assert components(overlay) == (shipped - set(ROLLOUT_TOOLS)) | {tool, "base"}

    def test_the_analysis_template_is_the_example_in_the_rollouts_namespace(self) -> None:
        """The argo overlay applies docs/examples/argo's AnalysisTemplate in `llm`, where
        the quick start creates Secret canaryd-auth."""
        example = yaml.safe_load((EXAMPLES / "argo" / "analysis-template.yaml").read_text())
        template = one(rendered("overlays/argo"), "AnalysisTemplate", "canaryd-verdict")
        example["metadata"]["namespace"] = "llm"
        assert template == example


class TestSecrets:
    @pytest.mark.parametrize("name", list(RENDERS))
    def test_the_quick_start_creates_every_secret_the_manifests_read(self, name: str) -> None:
        """Each `secretRef` and `secretKeyRef` of the rendered objects names a Secret (and
        key) the quick start creates in that object's namespace."""
        created = created_secrets()
        for manifest in rendered(name):
            namespace = manifest["metadata"].get("namespace")
            for key, value in _walk(manifest):
                if key in {"secretRef", "secretKeyRef"} and not value.get("optional"):
                    assert (namespace, value["name"]) in created, (key, value)
                    if key == "secretKeyRef":
                        assert value["key"] in created[(namespace, value["name"])], value

    def test_one_token_reaches_canaryd_and_both_rollout_tools(self) -> None:
        """canaryd's CANARYD_SERVER__AUTH_TOKEN, Argo's Secret canaryd-auth and the token
        the quick start puts in Flagger's Canary are one shell variable, set once."""
        created = created_secrets()
        token = created[("canaryd", "canaryd")]["CANARYD_SERVER__AUTH_TOKEN"]
        assert token == created[("llm", "canaryd-auth")]["token"] == "$TOKEN"
        assert ("TOKEN=$(openssl rand -hex 32)",) in quick_start()
        (sed,) = [argv for argv in quick_start() if argv[0] == "sed"]
        placeholder = sed[1].split("/")[1]
        assert sed[1] == f"s/{placeholder}/{token}/"
        canary = yaml.safe_load((REPO / sed[2]).read_text())
        for hook in canary["spec"]["analysis"]["webhooks"]:
            assert hook["metadata"]["token"] == placeholder, hook["name"]


class TestConfig:
    @pytest.mark.parametrize("name", list(RENDERS))
    def test_the_pod_loads_its_configuration(
        self, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The pod's canaryd.toml, environment and Secret load; the status port and the
        sink listen on the container ports of those names, which the Service exposes."""
        settings = pod_settings(name, tmp_path, monkeypatch)
        assert settings.server.auth_token is not None
        ports = canaryd_pod(name).ports
        assert _listen_port(settings.server.listen) == ports["metrics"]
        if "sink" in components(name):
            assert settings.traffic.listen is not None
            assert _listen_port(settings.traffic.listen) == ports["sink"]
        else:
            assert settings.traffic.listen is None and "sink" not in ports
        service = one(rendered(name), "Service", "canaryd")
        assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)


class TestFlows:
    @pytest.mark.parametrize("name", list(RENDERS))
    def test_the_policies_admit_each_flow_of_the_table(self, name: str) -> None:
        """Each row whose component the render has is admitted, by the policy the table
        names; the rows of a component it lacks are refused."""
        canaryd, rules = canaryd_pod(name), policies(name)
        for row in flow_table():
            for flow, direction in row.flows(canaryd):
                if row.component in components(name):
                    admitting = admitted_by(rules, flow, direction)
                    assert admitting is not None and row.policies <= admitting, row.flow
                    assert admits(rules, flow), row.flow
                else:
                    assert not admits(rules, flow), f"{row.flow} without {row.component}"

    @pytest.mark.parametrize("name", list(RENDERS))
    def test_every_rule_of_the_policies_is_a_row(self, name: str) -> None:
        """The table is the whole story: each peer and port a policy admits is a row that
        names that policy (a namespace, its pods' labels, the port)."""
        canaryd = canaryd_pod(name)
        for policy in policies(name):
            for direction, rules_key, peers_key in [
                ("in", "ingress", "from"),
                ("out", "egress", "to"),
            ]:
                for rule in policy["spec"].get(rules_key, []):
                    for peer, entry in itertools.product(rule[peers_key], rule["ports"]):
                        namespace = peer["namespaceSelector"]["matchLabels"][NAMESPACE_LABEL]
                        labels = peer.get("podSelector", {}).get("matchLabels", {})
                        port = canaryd.ports.get(entry["port"], entry["port"])
                        endpoint = Pod(namespace, labels)
                        assert any(
                            policy["metadata"]["name"] in r.policies
                            and (r.source if direction == "in" else r.destination) == endpoint
                            and (port, entry.get("protocol", "TCP")) in r.ports
                            for r in flow_table()
                        ), (policy["metadata"]["name"], peer, entry)

    @pytest.mark.parametrize("name", list(RENDERS))
    def test_flows_off_the_table_are_refused(self, name: str) -> None:
        """Another namespace, another port, a pod the rule does not select, the internet."""
        canaryd, rules = canaryd_pod(name), policies(name)
        refused = [
            Flow(Pod("default"), canaryd, 9466),
            Flow(Pod("monitoring"), canaryd, 9467),
            Flow(canaryd, Pod("default"), 443),
            Flow(canaryd, Pod("monitoring", {"app.kubernetes.io/name": "grafana"}), 9090),
            Flow(canaryd, Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}), 9091),
            Flow(canaryd, Pod("kube-system"), 53, "UDP"),
            Flow(canaryd, Pod("llm"), 8080),
        ]
        for flow in refused:
            assert not admits(rules, flow), flow

    @pytest.mark.parametrize("name", list(RENDERS))
    def test_every_address_the_configuration_uses_is_in_the_table(
        self, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each URL canaryd calls (arms, telemetry, storage, hooks) is a row from canaryd
        to its Service's namespace and port; each address it listens on, a row to it."""
        settings = pod_settings(name, tmp_path, monkeypatch)
        rows = [row for row in flow_table() if row.component in components(name)]
        for key, url in _urls(settings):
            namespace, port = _in_cluster(url)
            assert any(
                r.source is None
                and r.destination
                and r.destination.namespace == namespace
                and (port, "TCP") in r.ports
                for r in rows
            ), f"{key} = {url}: no row of docs/kubernetes.md's flow table"
        listening = [settings.server.listen, settings.traffic.listen]
        for address in filter(None, listening):
            port = _listen_port(address)
            assert any(r.destination is None and (port, "TCP") in r.ports for r in rows), address

    @pytest.mark.parametrize("tool", list(ROLLOUT_TOOLS))
    def test_the_rollout_tools_call_canaryd_where_the_policy_admits_them(self, tool: str) -> None:
        """The URLs the AnalysisTemplate and the Canary call resolve to canaryd's Service
        and container port, and the policy admits the tool's namespace there."""
        name = f"overlays/{tool}"
        if tool == "argo":
            template = one(rendered(name), "AnalysisTemplate", "canaryd-verdict")
            args = {a["name"]: a.get("value") for a in template["spec"]["args"]}
            urls = [args["canaryd-url"]]
        else:
            canary = yaml.safe_load((EXAMPLES / "flagger" / "canary.yaml").read_text())
            urls = [hook["url"] for hook in canary["spec"]["analysis"]["webhooks"]]
        canaryd = canaryd_pod(name)
        for url in urls:
            parts = urlsplit(url)
            service_name, namespace = (parts.hostname or "").split(".")[:2]
            service = one(rendered(name), "Service", service_name)
            assert service["metadata"]["namespace"] == namespace == canaryd.namespace
            (port,) = [p for p in service["spec"]["ports"] if p["port"] == parts.port]
            target = canaryd.ports[port["targetPort"]]
            flow = Flow(Pod(ROLLOUT_TOOLS[tool]), canaryd, target)
            assert admits(policies(name), flow), url
            assert any(
                r.source
                and r.source.namespace == ROLLOUT_TOOLS[tool]
                and (target, "TCP") in r.ports
                for r in flow_table()
            ), url
