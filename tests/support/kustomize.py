"""`kubectl kustomize <dir>` for the subset deploy/kustomize uses, so the tests render the
overlays where no kubectl is installed (tests/packaging/test_kustomize.py compares the two
where one is).

A kustomization's `resources` (files, or folders built first), then its `components`
(each adds its resources and patches the whole set so far), then its own `patches`, then
`namespace` and `images`: kustomize's order. A patch is a JSON 6902 list of operations or
a strategic merge patch; either applies to every object its `target` selects (kind, name
and namespace as anchored regular expressions, group and version exact). The strategic
merge follows Kubernetes' OpenAPI (the `x-kubernetes-patch-merge-key` of the schemas in
tests/fixtures/k8s) and kustomize's order for merged lists: the patch's items first, in
its order, then the rest. Anything else, a key or directive this module does not know,
raises `UnsupportedError` rather than rendering something kustomize would not.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
KUSTOMIZATION = "kustomization.yaml"
KINDS = {
    "Kustomization": {
        "apiVersion",
        "kind",
        "resources",
        "components",
        "patches",
        "namespace",
        "images",
    },
    "Component": {"apiVersion", "kind", "resources", "patches"},
}
PATCH_KEYS = {"path", "patch", "target"}
TARGET_KEYS = {"kind", "name", "namespace", "group", "version"}
IMAGE_KEYS = {"name", "newName", "newTag", "digest"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

Manifest = dict[str, Any]


class UnsupportedError(ValueError):
    """A kustomization or patch this renderer does not implement."""

    def __init__(self, where: Path | str, what: str) -> None:
        super().__init__(f"{where}: {what} is not supported by tests/support/kustomize.py")


class DuplicateError(ValueError):
    """Two resources with one identity, as kustomize refuses them."""

    def __init__(self, identity: tuple[str, str, str, str]) -> None:
        super().__init__(f"{identity!r} is declared twice")


def identity(manifest: Manifest) -> tuple[str, str, str, str]:
    meta = manifest.get("metadata", {})
    return (manifest["apiVersion"], manifest["kind"], meta.get("namespace", ""), meta["name"])


def build(folder: Path) -> list[Manifest]:
    """The objects `kubectl kustomize folder` prints (in declaration order, not its)."""
    return _build(folder, "Kustomization", [])


def _read_kustomization(folder: Path, expected: str) -> dict[str, Any]:
    path = folder / KUSTOMIZATION
    kustomization: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    kind = kustomization.get("kind", "Kustomization")
    if kind != expected:
        raise UnsupportedError(path, f"a {kind} where a {expected} is expected")
    unknown = set(kustomization) - KINDS[kind]
    if unknown:
        raise UnsupportedError(path, f"keys {sorted(unknown)}")
    return kustomization


def _build(folder: Path, kind: str, accumulated: list[Manifest]) -> list[Manifest]:
    kustomization = _read_kustomization(folder, kind)
    objects = accumulated
    for entry in kustomization.get("resources", []):
        path = (folder / entry).resolve()
        added = _build(path, "Kustomization", []) if path.is_dir() else _load(path)
        objects = _add(objects, added)
    for entry in kustomization.get("components", []):
        objects = _build((folder / entry).resolve(), "Component", objects)
    for patch in kustomization.get("patches", []):
        objects = _patch(folder, patch, objects)
    if "namespace" in kustomization:
        objects = [_with_namespace(o, kustomization["namespace"]) for o in objects]
    for image in kustomization.get("images", []):
        if set(image) - IMAGE_KEYS or "digest" in image:
            raise UnsupportedError(folder / KUSTOMIZATION, f"image {image!r}")
        objects = [_with_image(o, image) for o in objects]
    return objects


def _load(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _add(objects: list[Manifest], added: Iterable[Manifest]) -> list[Manifest]:
    seen = {identity(o) for o in objects}
    out = list(objects)
    for manifest in added:
        if identity(manifest) in seen:
            raise DuplicateError(identity(manifest))
        seen.add(identity(manifest))
        out.append(manifest)
    return out


# -- patches ---------------------------------------------------------------------------


def _patch(folder: Path, entry: dict[str, Any], objects: list[Manifest]) -> list[Manifest]:
    where = folder / KUSTOMIZATION
    if set(entry) - PATCH_KEYS or ("path" in entry) == ("patch" in entry):
        raise UnsupportedError(where, f"patch {entry!r}")
    text = (
        (folder / entry["path"]).read_text(encoding="utf-8") if "path" in entry else entry["patch"]
    )
    body = yaml.safe_load(text)
    target = entry.get("target")
    if target is None:
        if isinstance(body, list):
            raise UnsupportedError(where, "a JSON 6902 patch without a target")
        target = {"kind": body["kind"], "name": body["metadata"]["name"]}
    if set(target) - TARGET_KEYS:
        raise UnsupportedError(where, f"target {target!r}")
    out = []
    matched = False
    for manifest in objects:
        if _selected(manifest, target):
            matched = True
            if isinstance(body, list):
                manifest = _json6902(manifest, body)
            else:
                manifest = _strategic_merge(manifest, body)
        out.append(manifest)
    if not matched:  # kustomize is silent here; a patch that lands nowhere is a bug
        raise UnsupportedError(where, f"a patch whose target {target!r} selects nothing")
    return out


def _selected(manifest: Manifest, target: dict[str, str]) -> bool:
    group, _, version = manifest["apiVersion"].rpartition("/")
    meta = manifest.get("metadata", {})
    exact = {"group": group, "version": version}
    regex = {"kind": manifest["kind"], "name": meta["name"], "namespace": meta.get("namespace", "")}
    return all(exact[k] == v for k, v in target.items() if k in exact) and all(
        re.fullmatch(v, regex[k]) for k, v in target.items() if k in regex
    )


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise UnsupportedError(path, "a JSON pointer not starting with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json6902(manifest: Manifest, operations: list[dict[str, Any]]) -> Manifest:
    """RFC 6902's add, remove, replace and test."""
    out = copy.deepcopy(manifest)
    for operation in operations:
        op = operation["op"]
        *parents, last = _pointer(operation["path"])
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op == "test":
            current = node[int(last)] if isinstance(node, list) else node[last]
            if current != operation["value"]:
                raise ValueError(f"test {operation['path']}: {current!r} != {operation['value']!r}")
        elif op == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif op == "add" and isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(operation["value"]))
        elif op in {"add", "replace"}:
            if isinstance(node, list):
                node[int(last)] = copy.deepcopy(operation["value"])
            else:
                if op == "replace" and last not in node:
                    raise ValueError(f"replace {operation['path']}: no such member")
                node[last] = copy.deepcopy(operation["value"])
        else:
            raise UnsupportedError(operation["path"], f"op {op!r}")
    return out


@functools.cache
def _schemas() -> tuple[dict[tuple[str, str], Any], dict[str, Any]]:
    """(apiVersion, kind) -> the vendored schema, and the shared definitions."""
    kinds = {}
    for path in SCHEMAS.glob("*.json"):
        schema = json.loads(path.read_text(encoding="utf-8"))
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            kinds[(api, gvk["kind"])] = schema
    definitions = json.loads((SCHEMAS / "_definitions.json").read_text(encoding="utf-8"))
    return kinds, definitions["$defs"]


def _resolved(schema: Any) -> Any:
    while isinstance(schema, dict) and "$ref" in schema:
        schema = _schemas()[1][schema["$ref"].rpartition("/")[2]]
    return schema


def _strategic_merge(manifest: Manifest, patch: Manifest) -> Manifest:
    schema = _schemas()[0].get((manifest["apiVersion"], manifest["kind"]))
    merged: Manifest = _merge(manifest, patch, schema, manifest["kind"])
    return merged


def _merge(original: Any, patch: Any, schema: Any, where: str) -> Any:
    schema = _resolved(schema)
    if isinstance(patch, dict) and isinstance(original, dict):
        if any(key.startswith("$") for key in patch):
            raise UnsupportedError(where, f"directive {sorted(patch)}")
        properties = (schema or {}).get("properties", {})
        out = dict(original)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = _merge(out[key], value, properties.get(key), f"{where}.{key}")
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(patch, list) and isinstance(original, list):
        if schema is None:
            raise UnsupportedError(where, "a list merged without a schema")
        strategy = schema.get("x-kubernetes-patch-strategy", "")
        key = schema.get("x-kubernetes-patch-merge-key")
        if "merge" not in strategy.split(","):
            return copy.deepcopy(patch)
        if key is None:
            raise UnsupportedError(where, "a merged list of scalars")
        by_key = {item[key]: item for item in original}
        merged = [_merge(by_key.get(i[key], {}), i, schema.get("items"), where) for i in patch]
        named = {item[key] for item in patch}
        return merged + [copy.deepcopy(item) for item in original if item[key] not in named]
    return copy.deepcopy(patch)


# -- transformers ----------------------------------------------------------------------


def _with_namespace(manifest: Manifest, namespace: str) -> Manifest:
    if manifest["kind"] in CLUSTER_SCOPED:
        return manifest
    out = copy.deepcopy(manifest)
    out["metadata"]["namespace"] = namespace
    return out


def _with_image(manifest: Manifest, image: dict[str, str]) -> Manifest:
    out = copy.deepcopy(manifest)
    template = out.get("spec", {}).get("template", {}).get("spec", {})
    for container in [*template.get("containers", []), *template.get("initContainers", [])]:
        name, _, tag = container["image"].partition(":")
        if name == image["name"]:
            new_tag = image.get("newTag", tag)
            container["image"] = image.get("newName", name) + (f":{new_tag}" if new_tag else "")
    return out
