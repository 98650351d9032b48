#!/usr/bin/env python3
"""Generate host/src/cli/register_flags.tsv from gitlab-runner's source struct tags.

Source: gitlab-runner's common/config.go (RunnerConfig and every struct it nests),
cache/cacheconfig, referees and helpers/docker, read from a git checkout (default: the bare
mirror at /work/.mirror/gitlabhq+gitlab-runner/repo, HEAD). Only the tags are read; the rules
applied are those of gitlab-runner's flag builder (golang-cli-helpers) and TOML encoder
(BurntSushi/toml v1.6):

* flags: a field with a `long` (or `short`) tag is a flag; a struct field with a `namespace`
  tag is descended with the namespace joined by "-" in front of its fields' names; an
  embedded struct is descended without one; other structs are not flags.
* env: the `env` tag as written (a field without one has no variable).
* zero: what the encoder writes for the field when it holds its zero value and its table is
  written: numbers unless `omitzero`, bools and strings unless `omitempty`,
  nothing for nil pointers, slices and maps; a namespaced pointer struct is allocated by the
  flag builder and so written as a table, a value struct is written unless `omitempty`.

Usage: host/tools/gen_register_flags.py [REPO [COMMIT]] > host/src/cli/register_flags.tsv
"""
import re
import subprocess
import sys

REPO = sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/gitlabhq+gitlab-runner/repo"
COMMIT = sys.argv[2] if len(sys.argv) > 2 else "HEAD"
PACKAGES = {
    "common": "common",
    "cacheconfig": "cache/cacheconfig",
    "referees": "referees",
    "docker": "helpers/docker",
    "runner": "common/config/runner",
}


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True, text=True).stdout


def package_sources(directory):
    names = git("ls-tree", "--name-only", f"{COMMIT}:{directory}").split()
    for name in names:
        if name.endswith(".go") and not name.endswith("_test.go"):
            yield git("show", f"{COMMIT}:{directory}/{name}")


STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
ALIAS = re.compile(r"^type (\w+) (\[\]\w+|map\[[^\]]+\][\w\[\]]+|string|bool|int64|int|float64)\s*$", re.M)
GROUP = re.compile(r"^type \((.*?)^\)", re.M | re.S)
GROUPED = re.compile(r"^\s*(\w+)\s+=?\s*(\[\]\w+|map\[[^\]]+\][\w\[\]]+|string|bool|int64|int|float64)\s*$", re.M)
FIELD = re.compile(r"^\s*(\w+)\s+([\w.*\[\]]+)\s*(?:`([^`]*)`)?")
EMBED = re.compile(r"^\s*(\*?[\w.]+)\s*(?:`([^`]*)`)?\s*$")
TAG = re.compile(r'(\w+):"((?:[^"\\]|\\.)*)"')

structs = {}
aliases = {}
for pkg, directory in PACKAGES.items():
    for source in package_sources(directory):
        for m in STRUCT.finditer(source):
            structs[(pkg, m.group(1))] = m.group(2)
        for m in ALIAS.finditer(source):
            aliases[(pkg, m.group(1))] = m.group(2)
        # Grouped declarations: type ( Name map[string]string ... ).
        for block in GROUP.finditer(source):
            for m in GROUPED.finditer(block.group(1)):
                aliases[(pkg, m.group(1))] = m.group(2)


def resolve(pkg, typ):
    """(package, name) of a struct type, or None."""
    typ = typ.lstrip("*")
    if "." in typ:
        qual, name = typ.split(".", 1)
        key = (qual, name)
    else:
        key = (pkg, typ)
    return key if key in structs else None


def kind(pkg, typ):
    ptr = typ.startswith("*")
    base = typ.lstrip("*")
    if base == "api.ProcMountType":  # k8s.io/api/core/v1: a string type
        return "string"
    if base in ("time.Duration",):
        return "duration"
    if base == "time.Time":
        return "datetime"
    if "." not in base and (pkg, base) in aliases:
        base = aliases[(pkg, base)]
    if base.startswith("[]"):
        return "list"
    if base.startswith("map["):
        value = base[base.index("]") + 1 :]
        return "map-" + {"bool": "bool", "[]string": "list"}.get(value, "string")
    if base in ("bool",):
        return "optbool" if ptr else "bool"
    if base in ("int", "int64", "int32", "uint", "uint64"):
        return "int"
    if base in ("float64", "float32"):
        return "float"
    if base == "string":
        return "string"
    return "other"


def zero_literal(k, opts, ptr):
    # BurntSushi/toml: nil pointers, slices and maps are never written; `omitzero` omits only
    # numbers at 0; `omitempty` omits empty strings, slices, maps and false bools (not 0).
    if ptr or k.startswith("map") or k in ("list", "optbool", "other", "datetime"):
        return "-"
    if k in ("int", "float", "duration"):
        if "omitzero" in opts:
            return "-"
        return {"int": "0", "float": "0.0", "duration": '"0s"'}[k]
    if "omitempty" in opts:
        return "-"
    return {"bool": "false", "string": '""'}[k]


rows = []


def walk(key, path, ns, flags_on=True):
    pkg = key[0]
    for line in structs[key].splitlines():
        line = line.split("//")[0] if "`" not in line else line
        if not line.strip():
            continue
        m = FIELD.match(line)
        embedded = None
        if not m or m.group(1) in ("struct",):
            e = EMBED.match(line)
            if not e:
                continue
            embedded = e
        if embedded is not None or (m and m.group(2).startswith("`")):
            typ = embedded.group(1)
            if typ[0].islower() and "." not in typ:
                continue
            sub = resolve(pkg, typ)
            if sub:
                walk(sub, path, ns, flags_on)
            continue
        name, typ, tagtext = m.group(1), m.group(2), m.group(3) or ""
        if not name[0].isupper():
            continue
        tags = dict(TAG.findall(tagtext))
        toml = tags.get("toml", "")
        if toml == "-":
            continue
        parts = toml.split(",")
        tname, opts = (parts[0] or name), set(parts[1:])
        fpath = path + [tname]
        sub = resolve(pkg, typ)
        ptr = typ.startswith("*")
        if sub:
            namespace = tags.get("namespace", "")
            # The flag builder descends only into namespaced structs, and allocates the
            # namespaced pointers it descends into.
            descended = flags_on and bool(namespace)
            written = (descended and ptr) or (not ptr and "omitempty" not in opts)
            rows.append((".".join(fpath), "", "", "table", "{}" if written else "-"))
            walk(sub, fpath, ns + [namespace] if descended else ns, descended)
            continue
        k = kind(pkg, typ)
        names = []
        for t in ("long", "short") if flags_on else ():
            if tags.get(t):
                names.append("-".join(ns + [tags[t]]))
        env = tags.get("env", "")
        rows.append((".".join(fpath), ",".join(names), env, k, zero_literal(k, opts, ptr)))


walk(("common", "RunnerConfig"), [], [])
commit = git("rev-parse", COMMIT).strip()
print(f"# gitlab-runner register flags and written zero values, generated by host/tools/gen_register_flags.py")
print(f"# from gitlab-runner {commit} (common/config.go RunnerConfig and the structs it nests).")
print("# path\tflags (long first, then short; gitlab-runner's namespace-joined names)\tenv\tkind\tzero written")
for row in rows:
    print("\t".join(x if x else "-" for x in row))
