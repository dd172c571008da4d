#!/usr/bin/env python3
"""Renders a kustomization directory the way `kubectl kustomize` (kustomize v5) does, for the
few features deploy/kubernetes uses, so the deployment tests run where kubectl is missing
(Debian has no kustomize new enough, PyPI and npm none at all).

    kustomize.py DIR    # the rendered YAML stream on stdout

Strict by design: a field, option, patch operation or YAML construct it does not implement
exactly is an error naming it, never something rendered differently. What it implements:

  resources          files (every document in them, inside the kustomization's directory) and
                     directories with a kustomization of their own, built recursively
  configMapGenerator name, namespace, files (plain paths), options.disableNameSuffixHash: true
  patches            target {kind, name} (literal) with an inline JSON 6902 patch: add, replace,
                     remove; array indices and `-` (append)
  labels             pairs, includeSelectors: false, includeTemplates: false (metadata.labels)
  images             name, newName, newTag

Each kustomization builds its resources, then its generators, then applies its patches, its
labels and its images, in kustomize's order. Stricter than kustomize where kustomize is silently
lenient: a patch whose target matches nothing, a `replace` of a missing key (kustomize adds
it), plain scalars that YAML 1.1 and YAML 1.2 read differently (kustomize reads some fields with
one and some with the other), duplicate keys, anchors and aliases are all errors.

crates/sandgate/tests/deploy_e2e.rs renders every overlay with both this and kubectl on
machines that have kubectl and requires the same objects, and renders kustomize_fixture/
(the features above, in combinations) against kubectl's output stored beside it everywhere.
"""

import copy
import math
import os
import re
import sys

import yaml


class Refused(Exception):
    """Something this renderer does not implement, or input kustomize would not accept."""


# -- YAML ---------------------------------------------------------------------------------------

# YAML 1.2 core schema, which kustomize's kyaml mostly follows (go-yaml v3).
_CORE = [
    ("null", re.compile(r"~|null|Null|NULL|")),
    ("bool", re.compile(r"true|True|TRUE|false|False|FALSE")),
    ("int", re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")),
    (
        "float",
        re.compile(
            r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.nan|\.NaN|\.NAN"
        ),
    ),
]
# Booleans of YAML 1.1 (go-yaml v2, which reads kustomize's inline patches, also takes y and n).
_YAML11_BOOL = re.compile(r"y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF")


def _core_value(text):
    """What a YAML 1.2 reader makes of a plain scalar."""
    for tag, pattern in _CORE:
        if pattern.fullmatch(text):
            if tag == "null":
                return None
            if tag == "bool":
                return text.lower() == "true"
            if tag == "int":
                if text.startswith("0o"):
                    return int(text[2:], 8)
                if text.startswith("0x"):
                    return int(text[2:], 16)
                return int(text, 10)
            low = text.lower()
            if low.endswith(".inf"):
                return -math.inf if low.startswith("-") else math.inf
            if low == ".nan":
                return math.nan
            return float(text)
    return text


def _same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what readers of other YAML versions would read otherwise,
    duplicate keys, merge keys, anchors and aliases."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise Refused(f"line {event.start_mark.line + 1}: YAML aliases are not supported")
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise Refused(f"line {event.start_mark.line + 1}: YAML anchors are not supported")
        return super().compose_node(parent, index)

    def construct_object(self, node, deep=False):
        value = super().construct_object(node, deep=deep)
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            line = node.start_mark.line + 1
            if _YAML11_BOOL.fullmatch(node.value) or not _same(value, _core_value(node.value)):
                raise Refused(
                    f"line {line}: the plain scalar {node.value!r} means different things in "
                    "YAML 1.1 and YAML 1.2 (kustomize reads both); quote it"
                )
        return value

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise Refused(f"line {key_node.start_mark.line + 1}: YAML merge keys are not supported")
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise Refused(f"line {key_node.start_mark.line + 1}: a key that is not a string: {key!r}")
            if key in seen:
                raise Refused(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _construct_map(loader, node):
    # Built eagerly (PyYAML's own constructor yields an empty dict first), so that a refusal
    # inside a nested mapping surfaces at once.
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def load_all(text, origin):
    try:
        return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]
    except Refused as e:
        raise Refused(f"{origin}: {e}") from None
    except yaml.YAMLError as e:
        raise Refused(f"{origin}: not YAML: {e}") from None


class Dumper(yaml.SafeDumper):
    pass


def _represent_str(dumper, data):
    # Multi-line strings as literal blocks, as kustomize writes them (PyYAML falls back to a
    # quoted style when a block cannot hold the string exactly). Strings any YAML reader could
    # take for another type (yes, y, 1e3) are quoted.
    if "\n" in data:
        style = "|"
    elif _YAML11_BOOL.fullmatch(data) or not isinstance(_core_value(data), str):
        style = '"'
    else:
        style = None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


Dumper.add_representer(str, _represent_str)


# -- Helpers ------------------------------------------------------------------------------------


def expect_keys(where, mapping, allowed, required=()):
    if not isinstance(mapping, dict):
        raise Refused(f"{where}: expected a mapping, found {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise Refused(
            f"{where}: {', '.join(unknown)}: not implemented by this renderer "
            f"(it implements {', '.join(allowed)})"
        )
    for key in required:
        if key not in mapping:
            raise Refused(f"{where}: {key} is required")


def expect_str(where, value):
    if not isinstance(value, str):
        raise Refused(f"{where}: expected a string, found {value!r} ({type(value).__name__}); quote it")
    return value


def expect_list(where, value):
    if not isinstance(value, list):
        raise Refused(f"{where}: expected a list, found {type(value).__name__}")
    return value


def inside(root, path, where):
    """`path` (relative to `root`), which kustomize only loads from within the root."""
    if os.path.isabs(path):
        raise Refused(f"{where}: {path}: an absolute path (kustomize loads files only below the kustomization)")
    full = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([full, os.path.realpath(root)]) != os.path.realpath(root):
        raise Refused(f"{where}: {path}: not in or below {root} (kustomize refuses it)")
    return full


def res_id(obj):
    api = obj["apiVersion"]
    group, _, version = api.rpartition("/")
    meta = obj["metadata"]
    return (group, version, obj["kind"], meta.get("namespace", ""), meta["name"])


def describe(obj):
    ns = obj["metadata"].get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{obj['metadata']['name']}"


# -- Kustomizations -----------------------------------------------------------------------------

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
TOP_LEVEL = ("apiVersion", "kind", "resources", "configMapGenerator", "patches", "labels", "images")
NAME_CHARS = re.compile(r"[A-Za-z0-9-]+")


def kustomization_file(directory):
    found = [n for n in KUSTOMIZATION_NAMES if os.path.isfile(os.path.join(directory, n))]
    if not found:
        raise Refused(f"{directory}: no kustomization.yaml")
    if len(found) > 1:
        raise Refused(f"{directory}: more than one kustomization file: {', '.join(found)}")
    return os.path.join(directory, found[0])


def build(directory, stack=()):
    real = os.path.realpath(directory)
    if real in stack:
        raise Refused(f"{directory}: a cycle of kustomizations")
    path = kustomization_file(directory)
    with open(path, encoding="utf-8") as f:
        docs = load_all(f.read(), path)
    if len(docs) != 1:
        raise Refused(f"{path}: expected one document, found {len(docs)}")
    k = docs[0]
    expect_keys(path, k, TOP_LEVEL)
    if k.get("apiVersion", "kustomize.config.k8s.io/v1beta1") != "kustomize.config.k8s.io/v1beta1":
        raise Refused(f"{path}: apiVersion {k['apiVersion']!r} is not implemented")
    if k.get("kind", "Kustomization") != "Kustomization":
        raise Refused(f"{path}: kind {k['kind']!r} is not implemented")

    objects = []

    def accumulate(obj, origin):
        new = res_id(obj)
        for old in objects:
            if res_id(old) == new:
                raise Refused(f"{origin}: {describe(obj)} is already in the kustomization ({path})")
        objects.append(obj)

    for i, entry in enumerate(expect_list(f"{path}: resources", k.get("resources", []))):
        where = f"{path}: resources[{i}]"
        entry = expect_str(where, entry)
        if "://" in entry or entry.startswith(("github.com/", "git@")):
            raise Refused(f"{where}: {entry}: remote resources are not implemented")
        target = os.path.join(directory, entry)
        if os.path.isdir(target):
            for obj in build(target, stack + (real,)):
                accumulate(obj, where)
        elif os.path.isfile(target):
            file = inside(directory, entry, where)
            with open(file, encoding="utf-8") as f:
                found = load_all(f.read(), file)
            if not found:
                raise Refused(f"{file}: no objects")
            for obj in found:
                check_object(file, obj)
                accumulate(obj, where)
        else:
            raise Refused(f"{where}: {entry}: no such file or directory")

    for i, gen in enumerate(expect_list(f"{path}: configMapGenerator", k.get("configMapGenerator", []))):
        accumulate(config_map(directory, f"{path}: configMapGenerator[{i}]", gen), path)

    for i, patch in enumerate(expect_list(f"{path}: patches", k.get("patches", []))):
        apply_patch(f"{path}: patches[{i}]", patch, objects)

    for i, label in enumerate(expect_list(f"{path}: labels", k.get("labels", []))):
        apply_labels(f"{path}: labels[{i}]", label, objects)

    for i, image in enumerate(expect_list(f"{path}: images", k.get("images", []))):
        apply_image(f"{path}: images[{i}]", image, objects)

    return objects


def check_object(origin, obj):
    if not isinstance(obj, dict):
        raise Refused(f"{origin}: a document that is not a mapping")
    for key in ("apiVersion", "kind"):
        expect_str(f"{origin}: {key}", obj.get(key))
    if obj["kind"].endswith("List"):
        raise Refused(f"{origin}: {obj['kind']}: lists of objects are not implemented")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise Refused(f"{origin}: {obj['kind']} without metadata")
    expect_str(f"{origin}: {obj['kind']}: metadata.name", meta.get("name"))
    if "namespace" in meta:
        expect_str(f"{origin}: {obj['kind']} {meta['name']}: metadata.namespace", meta["namespace"])


# -- configMapGenerator -------------------------------------------------------------------------

CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def config_map(directory, where, gen):
    expect_keys(where, gen, ("name", "namespace", "files", "options"), required=("name", "files"))
    if "options" not in gen:
        raise Refused(
            f"{where}: options.disableNameSuffixHash: true is required: the name hash (and renaming "
            "the references to it) is not implemented"
        )
    options = gen["options"]
    expect_keys(f"{where}: options", options, ("disableNameSuffixHash",), required=("disableNameSuffixHash",))
    if options["disableNameSuffixHash"] is not True:
        raise Refused(
            f"{where}: options.disableNameSuffixHash must be true: the name hash (and renaming "
            "the references to it) is not implemented"
        )
    meta = {"name": expect_str(f"{where}: name", gen["name"])}
    if "namespace" in gen:
        meta["namespace"] = expect_str(f"{where}: namespace", gen["namespace"])
    data = {}
    for i, entry in enumerate(expect_list(f"{where}: files", gen["files"])):
        entry = expect_str(f"{where}: files[{i}]", entry)
        if "=" in entry:
            raise Refused(f"{where}: files[{i}]: {entry}: key=path entries are not implemented")
        file = inside(directory, entry, f"{where}: files[{i}]")
        key = os.path.basename(entry)
        if not CONFIG_MAP_KEY.fullmatch(key) or key in (".", "..") or len(key) > 253:
            raise Refused(f"{where}: files[{i}]: {key!r} is not a valid ConfigMap key")
        if key in data:
            raise Refused(f"{where}: files[{i}]: the key {key} twice")
        with open(file, "rb") as f:
            raw = f.read()
        try:
            data[key] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(f"{where}: files[{i}]: {entry}: not UTF-8 (binaryData is not implemented)") from None
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


# -- patches (JSON 6902) ------------------------------------------------------------------------


def apply_patch(where, patch, objects):
    expect_keys(where, patch, ("target", "patch"), required=("target", "patch"))
    target = patch["target"]
    expect_keys(f"{where}: target", target, ("kind", "name"))
    if not target:
        raise Refused(f"{where}: target: empty (matches everything)")
    for key, value in target.items():
        value = expect_str(f"{where}: target.{key}", value)
        # kustomize reads these as anchored regular expressions; only literal ones are here.
        if not NAME_CHARS.fullmatch(value):
            raise Refused(f"{where}: target.{key}: {value!r}: only letters, digits and '-' are implemented")
    text = expect_str(f"{where}: patch", patch["patch"])
    ops = load_all(text, f"{where}: patch")
    if len(ops) != 1 or not isinstance(ops[0], list):
        raise Refused(
            f"{where}: patch: only an inline JSON 6902 patch (a list of operations) is implemented, "
            "not a strategic merge patch"
        )
    matched = [
        o
        for o in objects
        if o["kind"] == target.get("kind", o["kind"]) and o["metadata"]["name"] == target.get("name", o["metadata"]["name"])
    ]
    if not matched:
        raise Refused(f"{where}: target {target} matches nothing (kustomize would skip the patch silently)")
    for obj in matched:
        for j, op in enumerate(ops[0]):
            try:
                apply_op(f"{where}: patch[{j}]", op, obj)
            except Refused as e:
                raise Refused(f"{e} (in {describe(obj)})") from None


def pointer(where, path):
    path = expect_str(f"{where}: path", path)
    if not path.startswith("/"):
        raise Refused(f"{where}: path {path!r}: must start with / (whole-document operations are not implemented)")
    tokens = path[1:].split("/")
    for t in tokens:
        if re.search(r"~[^01]|~$", t):
            raise Refused(f"{where}: path {path!r}: a ~ that is not ~0 or ~1")
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens]


def index(where, token, length, append_ok):
    if append_ok and token == "-":
        return length
    if not re.fullmatch(r"0|[1-9][0-9]*", token):
        raise Refused(f"{where}: {token!r} is not an array index")
    i = int(token)
    if i > length or (i == length and not append_ok):
        raise Refused(f"{where}: index {i} is out of range (the array has {length} elements)")
    return i


def apply_op(where, op, obj):
    if not isinstance(op, dict):
        raise Refused(f"{where}: an operation must be a mapping")
    kind = op.get("op")
    if kind in ("add", "replace"):
        expect_keys(where, op, ("op", "path", "value"), required=("path", "value"))
    elif kind == "remove":
        expect_keys(where, op, ("op", "path"), required=("path",))
    else:
        raise Refused(f"{where}: op {kind!r} is not implemented (add, replace, remove are)")
    tokens = pointer(where, op["path"])
    parent = obj
    for t in tokens[:-1]:
        if isinstance(parent, dict):
            if t not in parent:
                raise Refused(f"{where}: {kind} {op['path']}: {t} does not exist")
            parent = parent[t]
        elif isinstance(parent, list):
            parent = parent[index(where, t, len(parent), False)]
        else:
            raise Refused(f"{where}: {kind} {op['path']}: {t} is inside a scalar")
    last = tokens[-1]
    if isinstance(parent, dict):
        if kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif last not in parent:
            raise Refused(
                f"{where}: {kind} {op['path']}: no such key"
                + (" (kustomize would add it; say add)" if kind == "replace" else "")
            )
        elif kind == "replace":
            parent[last] = copy.deepcopy(op["value"])
        else:
            del parent[last]
    elif isinstance(parent, list):
        i = index(where, last, len(parent), kind == "add")
        if kind == "add":
            parent.insert(i, copy.deepcopy(op["value"]))
        elif kind == "replace":
            parent[i] = copy.deepcopy(op["value"])
        else:
            del parent[i]
    else:
        raise Refused(f"{where}: {kind} {op['path']}: the parent is a scalar")


# -- labels -------------------------------------------------------------------------------------


def apply_labels(where, label, objects):
    expect_keys(where, label, ("pairs", "includeSelectors", "includeTemplates"), required=("pairs",))
    for option in ("includeSelectors", "includeTemplates"):
        if label.get(option, False) is not False:
            raise Refused(f"{where}: {option}: only false is implemented (labels on metadata.labels alone)")
    pairs = label["pairs"]
    if not isinstance(pairs, dict) or not pairs:
        raise Refused(f"{where}: pairs: expected a mapping of labels")
    for key, value in pairs.items():
        expect_str(f"{where}: pairs.{key}", value)
    for obj in objects:
        labels = obj["metadata"].setdefault("labels", {})
        if not isinstance(labels, dict):
            raise Refused(f"{where}: {describe(obj)}: metadata.labels is not a mapping")
        labels.update(pairs)


# -- images -------------------------------------------------------------------------------------


def split_image(image):
    """kustomize's image.Split: name, tag, digest (a registry's port is part of the name)."""
    slash = image.find("/")
    search, offset = (image[slash:], slash) if slash > 0 else (image, 0)
    at, colon = search.find("@"), search.find(":")
    if colon < 0 and at < 0:
        return image, "", ""
    if at >= 0 and (at < colon or colon < 0):
        return image[: at + offset], "", image[at + offset + 1 :]
    if at >= 0:
        return image[: colon + offset], image[colon + offset + 1 : at + offset], image[at + offset + 1 :]
    return image[: colon + offset], image[colon + offset + 1 :], ""


def apply_image(where, image, objects):
    expect_keys(where, image, ("name", "newName", "newTag"), required=("name",))
    for key, value in image.items():
        expect_str(f"{where}: {key}", value)
    if "newName" not in image and "newTag" not in image:
        raise Refused(f"{where}: neither newName nor newTag")
    name = image["name"]
    if not re.fullmatch(r"[a-z0-9][a-z0-9._/:-]*", name):
        raise Refused(
            f"{where}: name {name!r}: only lower-case letters, digits, '.', '_', '/', ':' and '-' are implemented"
        )
    # kustomize's match: the name as a regular expression ('.' matches any character), an
    # optional tag. This renderer matches the name literally, and refuses where the two differ.
    theirs = re.compile(name + r"(@sha256)?(:[a-zA-Z0-9_.{}-]*)?")
    ours = re.compile(re.escape(name) + r"(:[a-zA-Z0-9_.-]*)?")

    def update(container, origin):
        value = container.get("image")
        if value is None:
            return
        value = expect_str(f"{origin}: image", value)
        matched = bool(ours.fullmatch(value))
        if matched != bool(theirs.fullmatch(value)) or (not matched and split_image(value)[0] == name):
            raise Refused(f"{where}: {origin}: image {value!r}: matching it against {name!r} is not implemented")
        if matched:
            new_name, tag, _ = split_image(value)
            new_name = image.get("newName", new_name)
            tag = image.get("newTag", tag)
            container["image"] = new_name + (":" + tag if tag else "")

    # As kustomize's legacy image filter: every `containers` and `initContainers` list, wherever
    # it is in the object.
    def walk(node, origin):
        if isinstance(node, list):
            for item in node:
                walk(item, origin)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    for c in value:
                        if isinstance(c, dict):
                            update(c, f"{origin} {key}[{c.get('name')}]")
                else:
                    walk(value, origin)

    for obj in objects:
        walk(obj, describe(obj))


# -- Output -------------------------------------------------------------------------------------

# kustomize's legacy output order: these kinds first, in this order, and these last.
ORDER_FIRST = [
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
]
ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


def order(obj):
    kind = obj["kind"]
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind)
    elif kind in ORDER_LAST:
        rank = len(ORDER_FIRST) + 1 + ORDER_LAST.index(kind)
    else:
        rank = len(ORDER_FIRST)
    group, version, kind, namespace, name = res_id(obj)
    return (rank, group, version, kind, namespace, name)


def render(directory):
    objects = sorted(build(directory), key=order)
    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=True, default_flow_style=False, width=1 << 20)


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print("usage: kustomize.py DIR", file=sys.stderr)
        return 2
    try:
        out = render(argv[1])
    except Refused as e:
        print(f"kustomize.py: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
