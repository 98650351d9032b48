#!/usr/bin/env python3
"""Validate Kubernetes objects strictly against the official models (PyPI `kubernetes`).

Reads JSON from FILE (or stdin with `-`): one object, a list of objects, or what
fake-kube's `GET /fake-kube/requests` answers (a list of {method, path, body}; POST and PUT
bodies are whole objects, PATCH bodies are checked without required fields). Each object's
model comes from its `apiVersion` and `kind` (`v1`/`Pod` -> V1Pod), or from `--kind`.

Strict: every key must be an attribute the model knows (its `attribute_map`), every value
of the type its `openapi_types` names (recursively through lists, maps and nested models),
and every required field present (the models' setters refuse None for those). The first bad
field is printed with its path (`Pod.spec.containers[0].imagePullPolicyy: unknown field`)
and the exit status is 1; 0 when every object is valid; 2 on bad usage.
"""

import argparse
import datetime
import json
import re
import sys

import kubernetes.client.models as models
from kubernetes.client import Configuration


class Invalid(Exception):
    pass


PRIMITIVES = {"str", "int", "float", "bool", "object", "datetime", "date"}


def model_class(api_version, kind):
    version = api_version.split("/")[-1] if api_version else "v1"
    name = version[0].upper() + version[1:] + kind
    cls = getattr(models, name, None)
    if cls is None:
        raise Invalid(f"no official model for apiVersion {api_version!r} kind {kind!r} ({name})")
    return cls


def check_primitive(value, kind, path):
    if kind == "object":
        return
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind in ("datetime", "date"):
        ok = isinstance(value, str)
        if ok:
            text = value.replace("Z", "+00:00")
            try:
                if kind == "date":
                    datetime.date.fromisoformat(text)
                else:
                    datetime.datetime.fromisoformat(text)
            except ValueError:
                raise Invalid(f"{path}: {value!r} is not an RFC 3339 {kind}")
    else:
        raise Invalid(f"{path}: unknown primitive type {kind}")
    if not ok:
        raise Invalid(f"{path}: expected {kind}, got {type(value).__name__} {json.dumps(value)[:80]}")


def check(value, kind, path, required):
    if value is None:
        return
    match = re.fullmatch(r"list\[(.+)\]", kind)
    if match:
        if not isinstance(value, list):
            raise Invalid(f"{path}: expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            check(item, match.group(1), f"{path}[{i}]", required)
        return
    match = re.fullmatch(r"dict\[str, (.+)\]|dict\(str, (.+)\)", kind)
    if match:
        if not isinstance(value, dict):
            raise Invalid(f"{path}: expected a map, got {type(value).__name__}")
        inner = match.group(1) or match.group(2)
        for key, item in value.items():
            check(item, inner, f"{path}[{key}]", required)
        return
    if kind in PRIMITIVES:
        check_primitive(value, kind, path)
        return
    cls = getattr(models, kind, None)
    if cls is None:
        raise Invalid(f"{path}: unknown model {kind}")
    check_model(value, cls, path, required)


def check_model(value, cls, path, required):
    if not isinstance(value, dict):
        raise Invalid(f"{path}: expected an object ({cls.__name__}), got {type(value).__name__}")
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key in value:
        if key not in by_json:
            raise Invalid(f"{path}.{key}: unknown field (not an attribute of {cls.__name__})")
    for key, item in value.items():
        attr = by_json[key]
        check(item, cls.openapi_types[attr], f"{path}.{key}", required)
    if required:
        probe = cls.__new__(cls)
        configuration = Configuration()
        configuration.client_side_validation = True
        probe.local_vars_configuration = configuration
        for attr, json_name in cls.attribute_map.items():
            if json_name in value:
                continue
            try:
                setattr(probe, attr, None)
            except ValueError:
                raise Invalid(f"{path}.{json_name}: required field missing ({cls.__name__})")


def objects_of(data):
    """(label, object, required) for each object in what was read."""
    items = data if isinstance(data, list) else [data]
    for i, item in enumerate(items):
        if isinstance(item, dict) and "body" in item and "path" in item and "method" in item:
            if isinstance(item["body"], dict):
                label = f"{item['method']} {item['path']}"
                yield label, item["body"], item["method"] != "PATCH"
        else:
            yield f"object {i}", item, True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="JSON file, or - for stdin")
    parser.add_argument("--kind", help="model of objects without apiVersion/kind (e.g. Pod)")
    parser.add_argument("--api-version", default="v1")
    args = parser.parse_args()
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
        data = json.loads(text)
    except (OSError, ValueError) as error:
        print(f"kube_models.py: cannot read {args.file}: {error}", file=sys.stderr)
        return 2
    count = 0
    for label, obj, required in objects_of(data):
        try:
            if not isinstance(obj, dict):
                raise Invalid("not a JSON object")
            kind = obj.get("kind") or args.kind
            if not kind:
                raise Invalid("no kind (give --kind)")
            cls = model_class(obj.get("apiVersion") or args.api_version, kind)
            check_model(obj, cls, kind, required)
        except Invalid as error:
            print(f"{label}: {error}", file=sys.stderr)
            return 1
        count += 1
    print(f"{count} object(s) valid against the official models (kubernetes {__import__('kubernetes').__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
