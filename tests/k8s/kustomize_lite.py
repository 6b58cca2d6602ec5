"""A small kustomize for the subset deploy/ uses, for machines without a modern kubectl.

Supported: `resources` (files and directories), `components` (directories whose resources are
added after the kustomization's own), `namespace`, `images`, `patches` (strategic
merge by path; target found by kind and name, or every object matched by a `target` of
group/version/kind/name/labelSelector (`key=value,...`); `$patch: delete` of a whole object or
of a keyed list item; a file holding a list is a JSON patch, ops test/remove/replace/add),
`configMapGenerator` (files; behaviours create, replace, merge; name hashes disabled). Anything
else raises, so deploy/ cannot quietly grow features this renderer ignores; tests compare it
with `kubectl kustomize` where available.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "images",
    "patches",
    "configMapGenerator",
    "generatorOptions",
}
CLUSTER_SCOPED = {
    "CustomResourceDefinition",
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterIssuer",
}
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
}


class KustomizeError(ValueError):
    pass


def build(path: Path, parent: list[Obj] | None = None) -> list[Obj]:
    """The objects of the kustomization at `path`; a component (`parent` given) adds its
    resources to its parent's objects and patches them all, as kustomize's components do."""
    spec = yaml.safe_load((path / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{path}: fields not supported by kustomize_lite: {sorted(unknown)}")
    objs: list[Obj] = [] if parent is None else parent
    for ref in spec.get("resources", []):
        target = path / ref
        objs += build(target) if target.is_dir() else [d for d in yaml.safe_load_all(target.read_text()) if d]
    for ref in spec.get("components", []):
        objs = build(path / ref, objs)
    _generate(path, spec, objs)
    for patch in spec.get("patches", []):
        if "path" not in patch or set(patch) - {"path", "target"}:
            raise KustomizeError(f"{path}: only `patches: [{{path: ..., target: ...}}]` is supported")
        for doc in yaml.safe_load_all((path / patch["path"]).read_text()):
            if isinstance(doc, list):  # a JSON patch (RFC 6902): to every object of its target
                for target in _select(objs, patch["target"]):
                    _json_patch(target, doc)
                continue
            if "target" in patch:
                targets = _select(objs, patch["target"])
            else:
                targets = [_find(objs, doc["kind"], doc["metadata"]["name"])]
            for target in targets:
                if doc.get("$patch") == "delete":
                    objs.remove(target)
                    continue
                merged = _merge(target, doc if "target" not in patch else _retarget(doc, target))
                target.clear()
                target.update(merged)
    for image in spec.get("images", []):
        _set_image(objs, image)
    if "namespace" in spec:
        _set_namespace(objs, spec["namespace"])
    return objs


def _generate(path: Path, spec: Obj, objs: list[Obj]) -> None:
    options = spec.get("generatorOptions", {})
    for gen in spec.get("configMapGenerator", []):
        gen_options = {**options, **gen.get("options", {})}
        if gen.get("behavior", "create") == "create" and not gen_options.get("disableNameSuffixHash"):
            raise KustomizeError(f"{path}: {gen['name']}: name hashes are not supported")
        data = {}
        for entry in gen.get("files", []):
            key, sep, file = entry.partition("=")
            if not sep:
                key, file = Path(entry).name, entry
            data[key] = (path / file).read_text()
        behavior = gen.get("behavior", "create")
        if behavior == "create":
            meta: Obj = {"name": gen["name"]}
            if gen_options.get("labels"):
                meta["labels"] = dict(gen_options["labels"])
            objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
        elif behavior in ("replace", "merge"):
            existing = _find(objs, "ConfigMap", gen["name"])
            existing["data"] = data if behavior == "replace" else {**existing.get("data", {}), **data}
        else:
            raise KustomizeError(f"{path}: unknown behavior {behavior!r}")


def _find(objs: list[Obj], kind: str, name: str) -> Obj:
    for obj in objs:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise KustomizeError(f"no {kind}/{name} to patch")


_SELECTOR_FIELDS = {"group", "version", "kind", "name", "labelSelector"}


def _select(objs: list[Obj], target: Obj) -> list[Obj]:
    """Every object a patch `target` matches (exact values, a labelSelector of `key=value`
    terms; kustomize's regexes and set-based selectors unsupported)."""
    if set(target) - _SELECTOR_FIELDS:
        raise KustomizeError(f"patch target: only {sorted(_SELECTOR_FIELDS)} are supported")
    fixed = {k: v for k, v in target.items() if k != "labelSelector"}
    labels = {}
    for term in filter(None, target.get("labelSelector", "").split(",")):
        key, sep, value = term.partition("=")
        if not sep or any(c in term for c in "!()"):
            raise KustomizeError(f"labelSelector {target['labelSelector']!r}: only key=value terms")
        labels[key.strip()] = value.strip()

    def fields(obj: Obj) -> dict[str, str]:
        group, _, version = obj["apiVersion"].rpartition("/")
        return {"group": group, "version": version, "kind": obj["kind"], "name": obj["metadata"]["name"]}

    return [
        o
        for o in objs
        if all(fields(o)[k] == v for k, v in fixed.items())
        and labels.items() <= o["metadata"].get("labels", {}).items()
    ]


def _json_patch(obj: Obj, ops: list[Obj]) -> None:
    """RFC 6902 on `obj` in place: test, remove, replace, add (a failed test raises, as in kustomize)."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = (len(node) if last == "-" else int(last)) if isinstance(node, list) else last
        if op["op"] == "test":
            if node[key] != op["value"]:
                raise KustomizeError(f"JSON patch test failed at {op['path']}: {node[key]!r}")
        elif op["op"] == "remove":
            del node[key]
        elif op["op"] == "replace":
            node[key] = copy.deepcopy(op["value"])
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(key, copy.deepcopy(op["value"]))
        elif op["op"] == "add":
            node[key] = copy.deepcopy(op["value"])
        else:
            raise KustomizeError(f"JSON patch op {op['op']!r} not supported")


def _retarget(doc: Obj, target: Obj) -> Obj:
    """A targeted patch applies to each match whatever kind and name it states itself."""
    return {
        **doc,
        "apiVersion": target["apiVersion"],
        "kind": target["kind"],
        "metadata": {**doc["metadata"], "name": target["metadata"]["name"]},
    }


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge: maps merge (null deletes), keyed lists merge by key, other lists replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = _merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    key = MERGE_KEYS.get(field)
    if key and isinstance(base, list) and isinstance(patch, list):
        out = copy.deepcopy(base)
        added = []  # kustomize puts items new to the list first
        for item in patch:
            match = next((i for i, b in enumerate(out) if b.get(key) == item.get(key)), None)
            if item.get("$patch") == "delete":
                if match is not None:
                    del out[match]
            elif match is None:
                added.append(copy.deepcopy(item))
            else:
                out[match] = _merge(out[match], item)
        return added + out
    return copy.deepcopy(patch)


def _containers(obj: Obj) -> list[Obj]:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def _set_image(objs: list[Obj], image: Obj) -> None:
    for obj in objs:
        for container in _containers(obj):
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def _set_namespace(objs: list[Obj], namespace: str) -> None:
    for obj in objs:
        if obj["kind"] in CLUSTER_SCOPED:
            continue
        obj["metadata"]["namespace"] = namespace
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
