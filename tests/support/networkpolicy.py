"""Whether Kubernetes NetworkPolicies admit a connection, as a CNI that enforces them
decides (networking.k8s.io/v1): a pod selected by no policy of a direction is open in
that direction; a selected one admits what some rule of some selecting policy admits
(policies add up). A rule admits a peer (`podSelector` in the policy's namespace,
`namespaceSelector`, or both: those pods in those namespaces; none listed: every peer) on
a port (a number, a range up to `endPort`, a name resolved on the destination pod's
container ports, or none listed: every port of the protocol, TCP by default). A namespace
is known by its `kubernetes.io/metadata.name` label, which Kubernetes sets on every one.
`ipBlock` peers match no pod here (pod addresses are not modelled), so a flow admitted
only by one reads as refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
Direction = Literal["Ingress", "Egress"]


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports


@dataclass(frozen=True)
class Flow:
    source: Pod
    destination: Pod
    port: int
    protocol: str = "TCP"


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector's verdict on `labels` (an empty selector selects everything)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if "egress" in spec else ["Ingress"]


def _peer_admits(peer: Mapping[str, Any], policy_namespace: str, pod: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    namespaces = peer.get("namespaceSelector")
    pods = peer.get("podSelector")
    if namespaces is None and pods is None:
        return False
    if namespaces is None:
        in_namespace = pod.namespace == policy_namespace
    else:
        in_namespace = selects(namespaces, {NAMESPACE_LABEL: pod.namespace})
    return in_namespace and (pods is None or selects(pods, pod.labels))


def _port_admits(entry: Mapping[str, Any], flow: Flow) -> bool:
    if entry.get("protocol", "TCP") != flow.protocol:
        return False
    port = entry.get("port")
    if port is None:
        return True
    if isinstance(port, str):
        return flow.destination.ports.get(port) == flow.port
    return bool(port <= flow.port <= entry.get("endPort", port))


def admitted_by(
    policies: Iterable[Mapping[str, Any]], flow: Flow, direction: Direction
) -> set[str] | None:
    """The names of the policies that admit `flow` at its destination (Ingress) or its
    source (Egress); None when no policy of that direction selects the pod there, which
    leaves it open."""
    pod, peer = (
        (flow.destination, flow.source)
        if direction == "Ingress"
        else (flow.source, flow.destination)
    )
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and direction in _types(p)
        and selects(p["spec"]["podSelector"], pod.labels)
    ]
    if not selecting:
        return None
    names = set()
    for policy in selecting:
        namespace = policy["metadata"]["namespace"]
        for rule in policy["spec"].get(rules_key, []):
            peers = rule.get(peers_key) or []
            ports = rule.get("ports") or []
            if (not peers or any(_peer_admits(p, namespace, peer) for p in peers)) and (
                not ports or any(_port_admits(p, flow) for p in ports)
            ):
                names.add(policy["metadata"]["name"])
    return names


def admits(policies: Iterable[Mapping[str, Any]], flow: Flow) -> bool:
    """Both ends let `flow` through."""
    policies = list(policies)
    return all(admitted_by(policies, flow, d) != set() for d in ("Egress", "Ingress"))
