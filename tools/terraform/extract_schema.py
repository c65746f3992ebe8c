"""Turn the jsii assembly of a CDKTF provider binding (google, time) into a Terraform provider schema.

The CDKTF bindings (PyPI ``cdktf-cdktf-provider-google``, ``cdktf-cdktf-provider-time``) are
generated from the real provider's ``terraform providers schema -json`` output, and their jsii
assembly keeps enough of it to rebuild a schema that Terraform core can validate and plan against:

* ``XxxConfig`` interfaces list every configurable argument (required unless ``optional``);
* resource classes and ``...OutputReference`` classes expose read-only getters for computed-only
  attributes;
* nested blocks are struct types; the generated JavaScript tells whether a repeated block wraps a
  set (``new XxxList(this, "name", true)``) or a list.

Lost in translation: whether an optional argument is also computed (only ``id`` is treated so), and
whether a collection of primitives is a list or a set (lists are assumed). Both are harmless for
``validate`` and ``plan``.

Output: JSON shaped like one entry of ``terraform providers schema -json``::

    {"provider": {"version": 0, "block": ...},
     "resource_schemas": {"google_x": {"version": 0, "block": ...}},
     "data_source_schemas": {...}}

Usage: python extract_schema.py WHEEL OUT.json [--types google_a,google_b]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
import zipfile

_LINK_NAME = re.compile(r"#([a-z0-9_]+)\s+\w+#\1\}")
# "{@link https://registry.terraform.io/providers/hashicorp/P/V/docs/resources/x P_x}": any provider.
_TYPE_LINK = re.compile(r"/docs/(resources|data-sources)/([a-z0-9_]+)\s+([a-z][a-z0-9_]*)\}")
_LIST_CTOR = re.compile(r"new (\w+List)\(this, \"([a-z0-9_]+)\", (true|false)\)")
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")

# Getters every generated class carries that are not schema attributes.
_FRAMEWORK_GETTERS = {
    "internalValue",
    "fqn",
    "creationStack",
    "terraformResourceType",
    "tfResourceType",
    "friendlyUniqueId",
    "terraformMetaArguments",
    "terraformGeneratorMetadata",
    "rawOverrides",
    "node",
    "stack",
    "dependsOn",
    "count",
    "forEach",
    "lifecycle",
    "provider",
    "provisioners",
    "connection",
}


def snake(name: str) -> str:
    return _CAMEL.sub(r"_\1", name).lower()


def prop_name(prop: dict) -> str:
    docs = prop.get("docs", {})
    for text in (docs.get("remarks", ""), docs.get("summary", "")):
        m = _LINK_NAME.search(text)
        if m:
            return m.group(1)
    return snake(prop["name"])


class Extractor:
    def __init__(self, jsii: dict, set_lists: set[str]):
        self.types = jsii["types"]
        self.set_lists = set_lists  # fqns of XxxList classes that wrap a set

    # -- types ---------------------------------------------------------------------------------
    def _strip_resolvable(self, t: dict) -> dict:
        if "union" in t:
            members = [m for m in t["union"]["types"] if m.get("fqn") != "cdktf.IResolvable"]
            if len(members) == 1:
                return members[0]
            return {"primitive": "any"}
        return t

    def cty(self, t: dict):
        """cty type (JSON form) for an attribute type, or None if it is a nested block."""
        t = self._strip_resolvable(t)
        if "primitive" in t:
            return {
                "string": "string",
                "number": "number",
                "boolean": "bool",
                "any": "dynamic",
                "date": "string",
                "json": "string",
            }[t["primitive"]]
        if "collection" in t:
            elem = self.cty(t["collection"]["elementtype"])
            if elem is None:
                return None
            kind = "map" if t["collection"]["kind"] == "map" else "list"
            return [kind, elem]
        fqn = t["fqn"]
        simple = {
            "cdktf.StringMap": ["map", "string"],
            "cdktf.NumberMap": ["map", "number"],
            "cdktf.BooleanMap": ["map", "bool"],
            "cdktf.AnyMap": ["map", "dynamic"],
            "cdktf.StringMapList": ["list", ["map", "string"]],
            "cdktf.NumberMapList": ["list", ["map", "number"]],
            "cdktf.BooleanMapList": ["list", ["map", "bool"]],
            "cdktf.AnyMapList": ["list", ["map", "dynamic"]],
        }
        if fqn in simple:
            return simple[fqn]
        return None

    def _computed_object_type(self, fqn: str):
        """cty type for a computed-only complex getter (XxxList / XxxOutputReference class)."""
        if fqn.endswith("List"):
            ref = fqn[: -len("List")] + "OutputReference"
            inner = self._computed_object_type(ref)
            return ["set" if fqn in self.set_lists else "list", inner]
        cls = self.types.get(fqn)
        attrs = {}
        for p in cls.get("properties", []) if cls else []:
            if p.get("static") or p["name"] in _FRAMEWORK_GETTERS or p["name"].endswith("Input"):
                continue
            sub = self.cty(p["type"])
            if sub is None:
                sub = self._computed_object_type(self._strip_resolvable(p["type"]).get("fqn", ""))
            attrs[prop_name(p)] = sub
        return ["object", attrs]

    # -- blocks --------------------------------------------------------------------------------
    def block(self, struct_fqn: str, getter_fqn: str | None) -> dict:
        """Schema block from a config struct, plus computed-only getters of its reference class."""
        struct = self.types[struct_fqn]
        attributes: dict[str, dict] = {}
        block_types: dict[str, dict] = {}
        configured = set()
        for p in struct.get("properties", []):
            name = prop_name(p)
            configured.add(p["name"])
            ctype = self.cty(p["type"])
            if ctype is not None:
                attr = {"type": ctype, "description_kind": "plain"}
                if p.get("optional"):
                    attr["optional"] = True
                    if name == "id":
                        attr["computed"] = True
                else:
                    attr["required"] = True
                attributes[name] = attr
                continue
            t = self._strip_resolvable(p["type"])
            if "collection" in t:  # repeated block
                elem_fqn = t["collection"]["elementtype"]["fqn"]
                list_fqn = elem_fqn + "List"
                nb = {
                    "nesting_mode": "set" if list_fqn in self.set_lists else "list",
                    "block": self.block(elem_fqn, elem_fqn + "OutputReference"),
                }
            else:
                elem_fqn = t["fqn"]
                if name == "timeouts":
                    nb = {"nesting_mode": "single", "block": self.block(elem_fqn, None)}
                else:
                    nb = {
                        "nesting_mode": "list",
                        "max_items": 1,
                        "block": self.block(elem_fqn, elem_fqn + "OutputReference"),
                    }
            if not p.get("optional"):
                nb["min_items"] = 1
            block_types[name] = nb
        if getter_fqn and getter_fqn in self.types:
            for p in self.types[getter_fqn].get("properties", []):
                n = p["name"]
                if (
                    p.get("static")
                    or not p.get("immutable")
                    or n in _FRAMEWORK_GETTERS
                    or n.endswith("Input")
                    or n in configured
                ):
                    continue
                name = prop_name(p)
                if name in attributes or name in block_types:
                    continue
                ctype = self.cty(p["type"])
                if ctype is None:
                    fqn = self._strip_resolvable(p["type"]).get("fqn", "")
                    if fqn.startswith("cdktf.") or fqn not in self.types:
                        continue
                    ctype = self._computed_object_type(fqn)
                attributes[name] = {"type": ctype, "computed": True, "description_kind": "plain"}
        return {"attributes": attributes, "block_types": block_types}

    def schemas(self, wanted: set[str] | None):
        out = {"provider": None, "resource_schemas": {}, "data_source_schemas": {}}
        for fqn, t in self.types.items():
            if t.get("kind") != "class" or t.get("base") not in (
                "cdktf.TerraformResource",
                "cdktf.TerraformDataSource",
                "cdktf.TerraformProvider",
            ):
                continue
            params = t.get("initializer", {}).get("parameters", [])
            cfg = next((p["type"]["fqn"] for p in params if p["name"] == "config"), None)
            if cfg is None:
                continue
            if t["base"] == "cdktf.TerraformProvider":
                block = self.block(cfg, None)
                block["attributes"].pop("alias", None)  # a meta-argument, not a schema attribute
                out["provider"] = {"version": 0, "block": block}
                continue
            m = _TYPE_LINK.search(t.get("docs", {}).get("summary", ""))
            if not m:
                continue
            kind, tname = m.group(1), m.group(3)
            if wanted is not None and tname not in wanted:
                continue
            key = "resource_schemas" if kind == "resources" else "data_source_schemas"
            block = self.block(cfg, fqn)
            block["attributes"].setdefault(
                "id", {"type": "string", "optional": True, "computed": True, "description_kind": "plain"}
            )
            out[key][tname] = {"version": 0, "block": block}
        return out


def load_wheel(wheel_path: str):
    with zipfile.ZipFile(wheel_path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".jsii.tgz"))
        blob = zf.read(name)
    set_lists: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        jsii = json.load(tf.extractfile("package/.jsii"))
        prefix = jsii["name"]
        for member in tf.getmembers():
            if not (member.name.startswith("package/lib/") and member.name.endswith("/index.js")):
                continue
            js = tf.extractfile(member).read().decode("utf-8", "replace")
            for cls, _field, wraps in _LIST_CTOR.findall(js):
                if wraps == "true":
                    set_lists.add(cls)
    # Qualify the List class names by every namespace they could live in.
    by_name: dict[str, list[str]] = {}
    for fqn in jsii["types"]:
        by_name.setdefault(fqn.rsplit(".", 1)[-1], []).append(fqn)
    set_fqns = {f for cls in set_lists for f in by_name.get(cls, []) if f.startswith(prefix)}
    return jsii, set_fqns


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("out")
    ap.add_argument("--types", default="", help="comma-separated type names to keep (default: all)")
    args = ap.parse_args(argv)
    jsii, set_fqns = load_wheel(args.wheel)
    wanted = {t.strip() for t in args.types.split(",") if t.strip()} or None
    schema = Extractor(jsii, set_fqns).schemas(wanted)
    with open(args.out, "w") as fh:
        json.dump(schema, fh, sort_keys=True, separators=(",", ":"))
    print(
        f"{args.out}: {len(schema['resource_schemas'])} resources, {len(schema['data_source_schemas'])} data sources",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
