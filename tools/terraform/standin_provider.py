"""A plan-only stand-in for a Terraform provider, serving a schema read from a JSON file.

Terraform needs a provider binary to ``init``, ``validate`` and ``plan``. The real google, time and
archive providers cannot be downloaded here, but their schemas can be rebuilt (see
``extract_schema.py``), and that is all Terraform core needs for validation and planning. This
program speaks the provider plugin protocol (v6, through the ``tf`` package's gRPC server) and:

* serves the schema (``GetProviderSchema``) and accepts every configuration it is asked to
  validate (Terraform core itself checks names, types, required arguments and block counts);
* plans a create by passing configured values through and marking every computed attribute the
  configuration left null as unknown, as a real provider does (``PlanResourceChange``);
* reads data sources: ``archive_file`` really builds its zip (so hashes in the plan are real);
  any other data source echoes its configuration;
* refuses to apply anything.

Usage (as the executable a filesystem mirror points at):
    python standin_provider.py --schema SCHEMA.json [--kind google|time|archive]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import zipfile

import msgpack
import tf.provider
from msgpack.ext import ExtType
from tf.gen import tfplugin_pb2 as pb
from tf.gen import tfplugin_pb2_grpc as rpc
from tf.runner import run_provider


class _UnknownType:
    """Terraform's "value not yet known" marker (msgpack extension 0)."""

    def __repr__(self) -> str:
        return "Unknown"


UNKNOWN = _UnknownType()


def _unpack(dv: pb.DynamicValue):
    if dv.msgpack:
        return msgpack.unpackb(
            dv.msgpack,
            raw=False,
            strict_map_key=False,
            ext_hook=lambda code, data: UNKNOWN if code == 0 else ExtType(code, data),
        )
    if dv.json:
        return json.loads(dv.json)
    return None


def _pack(value) -> pb.DynamicValue:
    def default(obj):
        if obj is UNKNOWN:
            return ExtType(0, b"")
        raise TypeError(f"cannot encode {obj!r}")

    return pb.DynamicValue(msgpack=msgpack.packb(value, default=default, use_bin_type=True))


_NESTING = {
    "single": pb.Schema.NestedBlock.SINGLE,
    "list": pb.Schema.NestedBlock.LIST,
    "set": pb.Schema.NestedBlock.SET,
    "map": pb.Schema.NestedBlock.MAP,
    "group": pb.Schema.NestedBlock.GROUP,
}


def _block_pb(block: dict) -> pb.Schema.Block:
    attrs = [
        pb.Schema.Attribute(
            name=name,
            type=json.dumps(a["type"]).encode(),
            description=a.get("description", ""),
            required=bool(a.get("required")),
            optional=bool(a.get("optional")),
            computed=bool(a.get("computed")),
            sensitive=bool(a.get("sensitive")),
            description_kind=pb.PLAIN,
        )
        for name, a in sorted(block.get("attributes", {}).items())
    ]
    nested = [
        pb.Schema.NestedBlock(
            type_name=name,
            block=_block_pb(nb["block"]),
            nesting=_NESTING[nb["nesting_mode"]],
            min_items=nb.get("min_items", 0),
            max_items=nb.get("max_items", 0),
        )
        for name, nb in sorted(block.get("block_types", {}).items())
    ]
    return pb.Schema.Block(attributes=attrs, block_types=nested, description_kind=pb.PLAIN)


def _schema_pb(entry: dict) -> pb.Schema:
    return pb.Schema(version=entry.get("version", 0), block=_block_pb(entry["block"]))


def mark_unknown(block: dict, value):
    """Copy of an object value where computed attributes left null become unknown."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for name, a in block.get("attributes", {}).items():
        if a.get("computed") and out.get(name) is None:
            out[name] = UNKNOWN
    for name, nb in block.get("block_types", {}).items():
        v = out.get(name)
        if v is None or v is UNKNOWN:
            continue
        if nb["nesting_mode"] in ("list", "set"):
            out[name] = [mark_unknown(nb["block"], item) for item in v]
        elif nb["nesting_mode"] == "map":
            out[name] = {k: mark_unknown(nb["block"], item) for k, item in v.items()}
        else:
            out[name] = mark_unknown(nb["block"], v)
    return out


def _diag(summary: str, detail: str = "") -> pb.Diagnostic:
    return pb.Diagnostic(severity=pb.Diagnostic.ERROR, summary=summary, detail=detail)


# ---------------------------------------------------------------------------------------------
# archive_file, done for real so the plan carries the real hashes of the zip.

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def _archive_entries(cfg: dict) -> list[tuple[str, bytes]]:
    entries: list[tuple[str, bytes]] = []
    for src in cfg.get("source") or []:
        entries.append((src["filename"], src["content"].encode()))
    if cfg.get("source_content") is not None:
        entries.append((cfg["source_content_filename"], cfg["source_content"].encode()))
    if cfg.get("source_file"):
        with open(cfg["source_file"], "rb") as fh:
            entries.append((os.path.basename(cfg["source_file"]), fh.read()))
    if cfg.get("source_dir"):
        root = cfg["source_dir"]
        excludes = {os.path.normpath(e) for e in (cfg.get("excludes") or [])}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for fn in sorted(filenames):
                full = os.path.join(dirpath, fn)
                rel = os.path.relpath(full, root)
                if os.path.normpath(rel) in excludes:
                    continue
                with open(full, "rb") as fh:
                    entries.append((rel.replace(os.sep, "/"), fh.read()))
    return sorted(entries)


def read_archive_file(cfg: dict) -> dict:
    if cfg.get("type") != "zip":
        raise ValueError(f'archive type {cfg.get("type")!r} is not supported (only "zip")')
    path = cfg["output_path"]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in _archive_entries(cfg):
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    with open(path, "rb") as fh:
        blob = fh.read()
    out = dict(cfg)
    out.update(
        id=hashlib.sha1(blob).hexdigest(),
        output_size=len(blob),
        output_md5=hashlib.md5(blob).hexdigest(),
        output_sha=hashlib.sha1(blob).hexdigest(),
        output_sha256=hashlib.sha256(blob).hexdigest(),
        output_base64sha256=base64.b64encode(hashlib.sha256(blob).digest()).decode(),
        output_sha512=hashlib.sha512(blob).hexdigest(),
        output_base64sha512=base64.b64encode(hashlib.sha512(blob).digest()).decode(),
    )
    return out


# ---------------------------------------------------------------------------------------------


class StandInServicer(rpc.ProviderServicer):
    def __init__(self, schema: dict, kind: str):
        self.schema = schema
        self.kind = kind
        self._response = None

    def GetProviderSchema(self, request, context):
        if self._response is None:
            s = self.schema
            self._response = pb.GetProviderSchema.Response(
                provider=_schema_pb(s["provider"]),
                provider_meta=pb.Schema(block=pb.Schema.Block()),
                resource_schemas={k: _schema_pb(v) for k, v in s.get("resource_schemas", {}).items()},
                data_source_schemas={k: _schema_pb(v) for k, v in s.get("data_source_schemas", {}).items()},
            )
        return self._response

    def ValidateProviderConfig(self, request, context):
        return pb.ValidateProviderConfig.Response()

    def ValidateResourceConfig(self, request, context):
        return pb.ValidateResourceConfig.Response()

    def ValidateDataResourceConfig(self, request, context):
        return pb.ValidateDataResourceConfig.Response()

    def ConfigureProvider(self, request, context):
        return pb.ConfigureProvider.Response()

    def UpgradeResourceState(self, request, context):
        raw = request.raw_state.json or b"null"
        return pb.UpgradeResourceState.Response(upgraded_state=pb.DynamicValue(json=raw))

    def ReadResource(self, request, context):
        return pb.ReadResource.Response(new_state=request.current_state, private=request.private)

    def PlanResourceChange(self, request, context):
        proposed = _unpack(request.proposed_new_state)
        if proposed is None:  # destroy
            return pb.PlanResourceChange.Response(planned_state=request.proposed_new_state)
        block = self.schema["resource_schemas"][request.type_name]["block"]
        return pb.PlanResourceChange.Response(planned_state=_pack(mark_unknown(block, proposed)))

    def ApplyResourceChange(self, request, context):
        return pb.ApplyResourceChange.Response(
            diagnostics=[
                _diag(
                    "This is a plan-only stand-in provider",
                    "lossspike's offline Terraform toolchain can init, validate and plan, never apply. "
                    "Use the real provider from the registry to deploy.",
                )
            ]
        )

    def ImportResourceState(self, request, context):
        return pb.ImportResourceState.Response(diagnostics=[_diag("The stand-in provider cannot import")])

    def ReadDataSource(self, request, context):
        cfg = _unpack(request.config)
        try:
            # Other data sources echo their configuration: computed attributes stay null, since a
            # data source's result must be wholly known.
            is_archive = self.kind == "archive" and request.type_name == "archive_file"
            state = read_archive_file(cfg) if is_archive else cfg
        except Exception as exc:  # reported to the user as a diagnostic
            return pb.ReadDataSource.Response(diagnostics=[_diag(f"{request.type_name}: {exc}")])
        return pb.ReadDataSource.Response(state=_pack(state))

    def StopProvider(self, request, context):
        return pb.StopProvider.Response()


class _App:
    def __init__(self, name: str):
        self.name = name

    def full_name(self) -> str:
        return f"registry.terraform.io/hashicorp/{self.name}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="plan-only stand-in Terraform provider")
    ap.add_argument("--schema", required=True)
    ap.add_argument("--kind", default="google")
    args, rest = ap.parse_known_args(argv)
    with open(args.schema) as fh:
        schema = json.load(fh)
    servicer = StandInServicer(schema, args.kind)
    # run_provider builds tf's own servicer from this name; hand it ours instead.
    tf.provider.ProviderServicer = lambda _app: servicer
    run_provider(_App(args.kind), [sys.argv[0], *rest])


if __name__ == "__main__":
    main()
