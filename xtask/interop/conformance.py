#!/usr/bin/env python3
"""Descriptor conformance check: our Jumpstarter .proto files vs. upstream 0.9.0.

Usage (inside a venv with ``jumpstarter-protocol==0.9.0`` installed)::

    python conformance.py OURS.bin [--self-test] [--verbose]

``OURS.bin`` is an encoded ``google.protobuf.FileDescriptorSet`` of our files
(``jumpstarter_proto::FILE_DESCRIPTOR_SET``).  The upstream side is obtained by
importing the generated ``*_pb2`` modules of ``jumpstarter-protocol`` and copying
each module's ``DESCRIPTOR`` into a ``FileDescriptorProto``.

Files are matched by name and compared structurally: package, syntax,
dependencies (``google/api/*`` ignored), messages (recursively, incl. the
``map_entry`` option), fields (name, number, type, type_name, label,
proto3_optional, oneof_index, json_name, default_value, standard options such as
``deprecated``), oneofs, enums and values, services and methods (input/output
type, client/server streaming, standard options).  Declaration order is checked
too.

Fields upstream added after 0.9.0 that we carry (``UPSTREAM_MAIN_FIELDS``, with upstream
main's number and type) are listed as ``allowed`` instead of reported: 0.9.0 peers skip
them as unknown proto3 fields. So are the methods, messages and files upstream main added
(``UPSTREAM_MAIN_RPCS``, ``UPSTREAM_MAIN_MESSAGES``, ``UPSTREAM_MAIN_FILES``): 0.9.0 peers
never call or send them.

Options that cannot change the wire format or the gRPC method paths are ignored
and listed as ``ignored (wire-neutral)``: all file options (``java_package``
etc.), ``google/api/*`` imports, and ``google.api.*`` extension options on
messages, fields and methods.

Every difference is printed on its own line as ``<path>: <what> <upstream> !=
<ours>``; the exit status is 1 if there is any difference, else 0.

With ``--self-test`` (after a clean comparison) copies of our descriptors are
mutated (e.g. ``DriverCallRequest.method`` number 2 -> 9) and the script
asserts that ``compare`` reports exactly the expected differences; it exits 1
if a mutation is not caught.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from collections import Counter
from typing import Callable, Iterable

from google.protobuf import descriptor_pb2

UPSTREAM_MODULES = [
    "jumpstarter_protocol.jumpstarter.v1.common_pb2",
    "jumpstarter_protocol.jumpstarter.v1.kubernetes_pb2",
    "jumpstarter_protocol.jumpstarter.v1.jumpstarter_pb2",
    "jumpstarter_protocol.jumpstarter.v1.router_pb2",
    "jumpstarter_protocol.jumpstarter.client.v1.client_pb2",
]

# Imports that only provide wire-neutral annotations.
IGNORED_IMPORT_PREFIX = "google/api/"
# Extension options (on messages, fields, methods, ...) that are wire-neutral.
IGNORED_EXTENSION_PREFIX = "google.api."
# Fields upstream added after 0.9.0 (its main as of 2026-08) that we carry too: proto3
# fields 0.9.0 peers skip as unknown, so the wire stays compatible. Each must have upstream
# main's number and type: (number, FieldDescriptorProto type).
_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
UPSTREAM_MAIN_FIELDS = {
    "jumpstarter.v1.GetReportResponse.motd": (5, _STRING),
    # The lease's context (JEP-0013): on the lease, and sent to its exporter.
    "jumpstarter.client.v1.Lease.context": (15, _MESSAGE),
    "jumpstarter.v1.StatusResponse.context": (4, _MESSAGE),
    # JEP-0013's log record fields.
    "jumpstarter.v1.LogStreamResponse.driver_type": (5, _STRING),
    "jumpstarter.v1.LogStreamResponse.operation": (6, _STRING),
    "jumpstarter.v1.LogStreamResponse.timestamp": (7, _MESSAGE),
    "jumpstarter.v1.LogStreamResponse.structured_fields": (8, _MESSAGE),
}
# Methods upstream main added to a 0.9.0 service (JEP-0013's endpoint discovery):
# (input type, output type).
UPSTREAM_MAIN_RPCS = {
    "jumpstarter.v1.ControllerService.GetServiceEndpoints": (
        ".jumpstarter.v1.GetServiceEndpointsRequest",
        ".jumpstarter.v1.GetServiceEndpointsResponse",
    ),
}
# Messages upstream main added to a 0.9.0 file (those of the methods above).
UPSTREAM_MAIN_MESSAGES = {
    "jumpstarter.v1.GetServiceEndpointsRequest",
    "jumpstarter.v1.GetServiceEndpointsResponse",
    "jumpstarter.v1.TelemetryEndpoint",
}
# Files upstream main added (JEP-0013's TelemetryService); 0.9.0 has no counterpart to
# compare them with (jumpstarter-proto's own test checks their names and numbers).
UPSTREAM_MAIN_FILES = {"jumpstarter/v1/telemetry.proto"}
# Fields of our own (lease sharing), numbered from 1001, far above upstream's sequential
# numbers, so that no field upstream adds can collide with them: (number, type).
OUR_FIELDS = {
    "jumpstarter.client.v1.Lease.shared_with": (1001, _STRING),
    "jumpstarter.client.v1.UpdateLeaseRequest.add_shared_with": (1001, _STRING),
    "jumpstarter.client.v1.UpdateLeaseRequest.remove_shared_with": (1002, _STRING),
}


def _added_field(path: str) -> str | None:
    """Why field `path` (message path + name) may be only in ours, or None."""
    if path in UPSTREAM_MAIN_FIELDS:
        return "upstream main, after 0.9.0"
    if path in OUR_FIELDS:
        return "ours, numbered above upstream's"
    return None


def _map_entry_field(path: str, entry: str) -> str | None:
    """The field of message `path` whose map entry type is named `entry`, if any."""
    if not entry.endswith("Entry"):
        return None
    for field in [k.rsplit(".", 1)[1] for k in list(UPSTREAM_MAIN_FIELDS) + list(OUR_FIELDS) if k.rsplit(".", 1)[0] == path]:
        if "".join(p[:1].upper() + p[1:] for p in field.split("_")) + "Entry" == entry:
            return field
    return None
def full_message(file_path: str, name: str) -> str:
    """The full name of top-level message `name` of the file `_compare_file` calls `file_path`."""
    return f"{_FILE_PACKAGES.get(file_path, '')}.{name}".lstrip(".")


# File name -> package, filled by _compare_file (top-level messages are matched per file).
_FILE_PACKAGES: dict[str, str] = {}
# Files present in our set only because they are imported (well-known types
# shipped by every protobuf runtime); they are not compared.
IMPORT_ONLY_PREFIX = "google/protobuf/"

FDP = descriptor_pb2.FileDescriptorProto
FieldType = descriptor_pb2.FieldDescriptorProto.Type
FieldLabel = descriptor_pb2.FieldDescriptorProto.Label


# --------------------------------------------------------------------------- loading


def load_upstream() -> list[FDP]:
    """FileDescriptorProtos of the upstream generated modules."""
    out = []
    for name in UPSTREAM_MODULES:
        mod = importlib.import_module(name)
        fdp = FDP()
        mod.DESCRIPTOR.CopyToProto(fdp)
        out.append(fdp)
    return out


def load_ours(path: str) -> list[FDP]:
    """FileDescriptorProtos from an encoded FileDescriptorSet."""
    with open(path, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    return list(fds.file)


# --------------------------------------------------------------------------- helpers


class _Raw(str):
    """A string printed without quotes (type names, the unset marker)."""


UNSET = _Raw("(unset)")


def _type_name(t: int) -> str:
    return _Raw(FieldType.Name(t).removeprefix("TYPE_").lower()) if t else UNSET


def _label_name(label: int) -> str:
    return _Raw(FieldLabel.Name(label).removeprefix("LABEL_").lower()) if label else UNSET


def _default_json_name(name: str) -> str:
    """protoc's ToJsonName: drop '_' and upper-case the following letter."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        elif upper:
            out.append(ch.upper())
            upper = False
        else:
            out.append(ch)
    return "".join(out)


def _fmt(v: object) -> str:
    if isinstance(v, _Raw):
        return str(v)
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


class _Ctx:
    """Collects differences, ignored options and statistics."""

    def __init__(self) -> None:
        self.diffs: list[str] = []
        self.ignored: list[tuple[str, str, str]] = []  # (side, what, path)
        self.allowed: list[str] = []  # upstream main's additions (UPSTREAM_MAIN_FIELDS)
        self.stats: Counter[str] = Counter()

    def diff(self, path: str, what: str, up: object, ours: object) -> None:
        self.diffs.append(f"{path}: {what} {_fmt(up)} != {_fmt(ours)}")

    def eq(self, path: str, what: str, up: object, ours: object) -> None:
        if up != ours:
            self.diff(path, what, up, ours)

    def ignore(self, side: str, what: str, path: str) -> None:
        self.ignored.append((side, what, path))


def _is_repeated(fd) -> bool:
    # protobuf >= 6 has FieldDescriptor.is_repeated; older versions only .label.
    if hasattr(fd, "is_repeated"):
        return bool(fd.is_repeated)
    return fd.label == fd.LABEL_REPEATED


def _split_options(ctx: _Ctx, side: str, path: str, kind: str, opts, has: bool) -> tuple[dict, int]:
    """Split an options message into compared standard options and ignored ones.

    Returns ({standard option name: value}, number of unrecognised bytes).
    Extension options under ``google.api.`` are recorded as ignored; any other
    extension is returned as a compared option (so it shows up as a difference).
    """
    if not has:
        return {}, 0
    std: dict[str, object] = {}
    rest = copy.deepcopy(opts)
    for fd, value in opts.ListFields():
        if fd.is_extension:
            rest.ClearExtension(fd)
            if fd.full_name.startswith(IGNORED_EXTENSION_PREFIX):
                ctx.ignore(side, f"[{fd.full_name}] on {kind}", path)
                continue
            std[f"[{fd.full_name}]"] = str(value)
        else:
            rest.ClearField(fd.name)
            if kind == "file":
                # File options (java_package, go_package, ...) only steer code
                # generators; none of them changes the wire.
                ctx.ignore(side, f"file option {fd.name}", path)
                continue
            std[fd.name] = list(value) if _is_repeated(fd) else value
    return std, rest.ByteSize()


def _compare_options(ctx: _Ctx, path: str, kind: str, up, up_has: bool, ours, ours_has: bool) -> None:
    u, u_unknown = _split_options(ctx, "upstream", path, kind, up, up_has)
    o, o_unknown = _split_options(ctx, "ours", path, kind, ours, ours_has)
    for key in sorted(set(u) | set(o)):
        ctx.eq(path, f"option {key}", u.get(key, UNSET), o.get(key, UNSET))
    if u_unknown or o_unknown:
        ctx.diff(path, "unrecognised option bytes", u_unknown, o_unknown)


def _match(
    ctx: _Ctx,
    path: str,
    what: str,
    up_items: Iterable,
    our_items: Iterable,
    key: Callable = lambda x: x.name,
) -> list[tuple[object, object]]:
    """Match two lists by key; report missing/extra/order; return the pairs."""
    up_list, our_list = list(up_items), list(our_items)
    up_map = {key(x): x for x in up_list}
    our_map = {key(x): x for x in our_list}
    for k in up_map:
        if k not in our_map:
            ctx.diffs.append(f"{path}: {what} {k} missing in ours")
    for k in our_map:
        if k not in up_map:
            full = f"{path}.{k}"
            added = (UPSTREAM_MAIN_FIELDS.get(full) or OUR_FIELDS.get(full)) if what == "field" else None
            if added is not None and (our_map[k].number, our_map[k].type) == added:
                ctx.allowed.append(f"{path}: field {k} = {added[0]} ({_added_field(full)})")
                continue
            if what == "rpc" and (our_map[k].input_type, our_map[k].output_type) == UPSTREAM_MAIN_RPCS.get(full):
                ctx.allowed.append(f"{path}: rpc {k} (upstream main, after 0.9.0)")
                continue
            if what == "message" and full_message(path, k) in UPSTREAM_MAIN_MESSAGES:
                ctx.allowed.append(f"{path}: message {k} (upstream main, after 0.9.0)")
                continue
            if what == "nested message" and our_map[k].options.map_entry and _map_entry_field(path, k):
                ctx.allowed.append(f"{path}: {k} (the map entry of {_map_entry_field(path, k)})")
                continue
            ctx.diffs.append(f"{path}: {what} {k} only in ours")
    up_order = [key(x) for x in up_list if key(x) in our_map]
    our_order = [key(x) for x in our_list if key(x) in up_map]
    if up_order != our_order:
        ctx.diff(path, f"{what} order", up_order, our_order)
    return [(up_map[k], our_map[k]) for k in up_order]


# --------------------------------------------------------------------------- comparison


def _compare_enum(ctx: _Ctx, path: str, up, ours) -> None:
    ctx.stats["enums"] += 1
    _compare_options(ctx, path, "enum", up.options, up.HasField("options"), ours.options, ours.HasField("options"))
    ctx.eq(path, "reserved_range", [(r.start, r.end) for r in up.reserved_range], [(r.start, r.end) for r in ours.reserved_range])
    ctx.eq(path, "reserved_name", list(up.reserved_name), list(ours.reserved_name))
    for u, o in _match(ctx, path, "enum value", up.value, ours.value):
        ctx.stats["enum values"] += 1
        vpath = f"{path}.{u.name}"
        ctx.eq(vpath, "number", u.number, o.number)
        _compare_options(ctx, vpath, "enum value", u.options, u.HasField("options"), o.options, o.HasField("options"))


def _compare_field(ctx: _Ctx, path: str, up, ours) -> None:
    ctx.stats["fields"] += 1
    ctx.eq(path, "number", up.number, ours.number)
    ctx.eq(path, "type", _type_name(up.type), _type_name(ours.type))
    ctx.eq(path, "type_name", up.type_name, ours.type_name)
    ctx.eq(path, "label", _label_name(up.label), _label_name(ours.label))
    ctx.eq(path, "proto3_optional", up.proto3_optional, ours.proto3_optional)
    ctx.eq(
        path,
        "oneof_index",
        up.oneof_index if up.HasField("oneof_index") else UNSET,
        ours.oneof_index if ours.HasField("oneof_index") else UNSET,
    )
    # Effective JSON name (an unset json_name means the default lowerCamelCase).
    up_json = up.json_name if up.HasField("json_name") else _default_json_name(up.name)
    our_json = ours.json_name if ours.HasField("json_name") else _default_json_name(ours.name)
    ctx.eq(path, "json_name", up_json, our_json)
    ctx.eq(path, "default_value", up.default_value, ours.default_value)
    ctx.eq(path, "extendee", up.extendee, ours.extendee)
    _compare_options(ctx, path, "field", up.options, up.HasField("options"), ours.options, ours.HasField("options"))


def _compare_message(ctx: _Ctx, path: str, up, ours) -> None:
    ctx.stats["messages"] += 1
    # map_entry / deprecated / message_set_wire_format are standard options and
    # therefore compared; google.api.resource is ignored.
    _compare_options(ctx, path, "message", up.options, up.HasField("options"), ours.options, ours.HasField("options"))
    # The synthetic oneof of an added proto3 `optional` field is the field's, not a change.
    our_oneofs = [o for o in ours.oneof_decl if not (o.name.startswith("_") and _added_field(f"{path}.{o.name[1:]}"))]
    ctx.eq(path, "oneof names", [o.name for o in up.oneof_decl], [o.name for o in our_oneofs])
    for i, (u, o) in enumerate(zip(up.oneof_decl, our_oneofs)):
        _compare_options(ctx, f"{path}.oneof[{i}]", "oneof", u.options, u.HasField("options"), o.options, o.HasField("options"))
    ctx.eq(path, "reserved_range", [(r.start, r.end) for r in up.reserved_range], [(r.start, r.end) for r in ours.reserved_range])
    ctx.eq(path, "reserved_name", list(up.reserved_name), list(ours.reserved_name))
    ctx.eq(path, "extension_range", [(r.start, r.end) for r in up.extension_range], [(r.start, r.end) for r in ours.extension_range])
    for u, o in _match(ctx, path, "field", up.field, ours.field):
        _compare_field(ctx, f"{path}.{u.name}", u, o)
    for u, o in _match(ctx, path, "extension", up.extension, ours.extension):
        _compare_field(ctx, f"{path}.{u.name}", u, o)
    for u, o in _match(ctx, path, "nested message", up.nested_type, ours.nested_type):
        _compare_message(ctx, f"{path}.{u.name}", u, o)
    for u, o in _match(ctx, path, "nested enum", up.enum_type, ours.enum_type):
        _compare_enum(ctx, f"{path}.{u.name}", u, o)


def _compare_service(ctx: _Ctx, path: str, up, ours) -> None:
    ctx.stats["services"] += 1
    _compare_options(ctx, path, "service", up.options, up.HasField("options"), ours.options, ours.HasField("options"))
    for u, o in _match(ctx, path, "rpc", up.method, ours.method):
        ctx.stats["rpcs"] += 1
        mpath = f"{path}.{u.name}"
        ctx.eq(mpath, "input_type", u.input_type, o.input_type)
        ctx.eq(mpath, "output_type", u.output_type, o.output_type)
        ctx.eq(mpath, "client_streaming", u.client_streaming, o.client_streaming)
        ctx.eq(mpath, "server_streaming", u.server_streaming, o.server_streaming)
        _compare_options(ctx, mpath, "method", u.options, u.HasField("options"), o.options, o.HasField("options"))


def _compare_file(ctx: _Ctx, up: FDP, ours: FDP) -> None:
    ctx.stats["files"] += 1
    path = up.name
    ctx.eq(path, "package", up.package, ours.package)
    # An unset syntax means proto2.
    ctx.eq(path, "syntax", up.syntax or "proto2", ours.syntax or "proto2")
    ctx.eq(path, "edition", up.edition, ours.edition)
    for side, fdp in (("upstream", up), ("ours", ours)):
        for dep in fdp.dependency:
            if dep.startswith(IGNORED_IMPORT_PREFIX):
                ctx.ignore(side, f"import {dep}", path)

    def deps(f: FDP) -> list[str]:
        return [d for d in f.dependency if not d.startswith(IGNORED_IMPORT_PREFIX)]

    def public_deps(f: FDP) -> list[str]:
        return [f.dependency[i] for i in f.public_dependency]

    def weak_deps(f: FDP) -> list[str]:
        return [f.dependency[i] for i in f.weak_dependency]

    ctx.eq(path, "dependency", deps(up), deps(ours))
    ctx.eq(path, "public_dependency", public_deps(up), public_deps(ours))
    ctx.eq(path, "weak_dependency", weak_deps(up), weak_deps(ours))
    _compare_options(ctx, path, "file", up.options, up.HasField("options"), ours.options, ours.HasField("options"))

    pkg = f"{up.package}." if up.package else ""
    _FILE_PACKAGES[path] = up.package
    for u, o in _match(ctx, path, "message", up.message_type, ours.message_type):
        _compare_message(ctx, f"{pkg}{u.name}", u, o)
    for u, o in _match(ctx, path, "enum", up.enum_type, ours.enum_type):
        _compare_enum(ctx, f"{pkg}{u.name}", u, o)
    for u, o in _match(ctx, path, "service", up.service, ours.service):
        _compare_service(ctx, f"{pkg}{u.name}", u, o)
    for u, o in _match(ctx, path, "extension", up.extension, ours.extension):
        _compare_field(ctx, f"{pkg}{u.name}", u, o)


def _run(upstream_fdps: Iterable[FDP], our_fdps: Iterable[FDP]) -> _Ctx:
    ctx = _Ctx()
    up_files = {f.name: f for f in upstream_fdps}
    our_files = {f.name: f for f in our_fdps}
    for name, up in up_files.items():
        ours = our_files.get(name)
        if ours is None:
            ctx.diffs.append(f"{name}: file missing in ours")
            continue
        _compare_file(ctx, up, ours)
    for name in our_files:
        if name in UPSTREAM_MAIN_FILES and name not in up_files:
            ctx.allowed.append(f"{name}: file (upstream main, after 0.9.0)")
        elif name not in up_files and not name.startswith(IMPORT_ONLY_PREFIX):
            ctx.diffs.append(f"{name}: file only in ours")
    return ctx


def compare(upstream_fdps: Iterable[FDP], our_fdps: Iterable[FDP]) -> list[str]:
    """Pure structural comparison; returns one line per difference (empty if identical).

    Files are matched by name.  Files of ours under ``google/protobuf/`` that
    upstream does not list (well-known-type imports) are skipped.
    """
    return _run(upstream_fdps, our_fdps).diffs


# --------------------------------------------------------------------------- self-test


def _find_message(fdps: list[FDP], full_name: str):
    for f in fdps:
        prefix = f"{f.package}." if f.package else ""
        if not full_name.startswith(prefix):
            continue
        parts = full_name[len(prefix):].split(".")
        candidates = f.message_type
        msg = None
        for part in parts:
            msg = next((m for m in candidates if m.name == part), None)
            if msg is None:
                break
            candidates = msg.nested_type
        if msg is not None:
            return msg
    raise KeyError(full_name)


def _find_field(fdps: list[FDP], full_name: str):
    msg_name, _, field = full_name.rpartition(".")
    return next(f for f in _find_message(fdps, msg_name).field if f.name == field)


def _find_enum(fdps: list[FDP], full_name: str):
    for f in fdps:
        for e in f.enum_type:
            if f"{f.package}.{e.name}" == full_name:
                return e
    raise KeyError(full_name)


def _find_method(fdps: list[FDP], full_name: str):
    svc_name, _, method = full_name.rpartition(".")
    for f in fdps:
        for s in f.service:
            if f"{f.package}.{s.name}" == svc_name:
                return next(m for m in s.method if m.name == method)
    raise KeyError(full_name)


def _mut_field_number(fdps):
    _find_field(fdps, "jumpstarter.v1.DriverCallRequest.method").number = 9


def _mut_streaming(fdps):
    _find_method(fdps, "jumpstarter.v1.ExporterService.StreamingDriverCall").server_streaming = False


def _mut_enum_value(fdps):
    next(v for v in _find_enum(fdps, "jumpstarter.v1.FrameType").value if v.name == "FRAME_TYPE_PING").number = 5


def _mut_type(fdps):
    _find_field(fdps, "jumpstarter.v1.GetStatusResponse.status_version").type = FieldType.TYPE_INT64


def _mut_map_entry(fdps):
    _find_message(fdps, "jumpstarter.v1.LabelSelector.MatchLabelsEntry").options.ClearField("map_entry")


def _mut_deprecated(fdps):
    _find_field(fdps, "jumpstarter.client.v1.Exporter.online").options.ClearField("deprecated")


def _mut_json_name(fdps):
    _find_field(fdps, "jumpstarter.v1.Condition.observedGeneration").json_name = "observed_generation"


def _mut_extra_field(fdps):
    _find_message(fdps, "jumpstarter.v1.UnregisterRequest").field.add(
        name="id", number=1, type=FieldType.TYPE_STRING, label=FieldLabel.LABEL_OPTIONAL, json_name="id"
    )


def _mut_wire_neutral(fdps):
    # A file option is wire-neutral and must NOT be reported.
    next(f for f in fdps if f.name == "jumpstarter/v1/router.proto").options.java_package = "x.y"


def _mut_upstream_main_field(fdps: list[FDP]) -> None:
    # An upstream-main field with another number than upstream main's is a difference.
    _find_field(fdps, "jumpstarter.v1.GetReportResponse.motd").number = 6


def _mut_upstream_main_rpc(fdps: list[FDP]) -> None:
    # An upstream-main method with another output type than upstream main's is a difference.
    _find_method(fdps, "jumpstarter.v1.ControllerService.GetServiceEndpoints").output_type = ".jumpstarter.v1.TelemetryEndpoint"


def _mut_unlisted_message(fdps: list[FDP]) -> None:
    # A message only in ours that upstream main does not have is a difference.
    next(f for f in fdps if f.name == "jumpstarter/v1/jumpstarter.proto").message_type.add(name="Extra")


SELF_TEST_MUTATIONS: list[tuple[str, Callable[[list[FDP]], None], list[str]]] = [
    ("field number", _mut_field_number, ["jumpstarter.v1.DriverCallRequest.method: number 2 != 9"]),
    (
        "streaming flag",
        _mut_streaming,
        ["jumpstarter.v1.ExporterService.StreamingDriverCall: server_streaming True != False"],
    ),
    ("enum value", _mut_enum_value, ["jumpstarter.v1.FrameType.FRAME_TYPE_PING: number 6 != 5"]),
    ("field type", _mut_type, ["jumpstarter.v1.GetStatusResponse.status_version: type uint64 != int64"]),
    (
        "map entry",
        _mut_map_entry,
        ["jumpstarter.v1.LabelSelector.MatchLabelsEntry: option map_entry True != (unset)"],
    ),
    (
        "deprecated option",
        _mut_deprecated,
        ["jumpstarter.client.v1.Exporter.online: option deprecated True != (unset)"],
    ),
    (
        "json name",
        _mut_json_name,
        ["jumpstarter.v1.Condition.observedGeneration: json_name 'observedGeneration' != 'observed_generation'"],
    ),
    ("extra field", _mut_extra_field, ["jumpstarter.v1.UnregisterRequest: field id only in ours"]),
    ("wire-neutral file option", _mut_wire_neutral, []),
    (
        "upstream main field renumbered",
        _mut_upstream_main_field,
        ["jumpstarter.v1.GetReportResponse: field motd only in ours"],
    ),
    (
        "upstream main rpc changed",
        _mut_upstream_main_rpc,
        ["jumpstarter.v1.ControllerService: rpc GetServiceEndpoints only in ours"],
    ),
    ("message only in ours", _mut_unlisted_message, ["jumpstarter/v1/jumpstarter.proto: message Extra only in ours"]),
]


def self_test(upstream: list[FDP], ours: list[FDP]) -> bool:
    """Mutate copies of our descriptors; check compare() reports exactly the expected diffs."""
    ok = True
    for label, mutate, expected in SELF_TEST_MUTATIONS:
        mutated = [copy.deepcopy(f) for f in ours]
        mutate(mutated)
        got = compare(upstream, mutated)
        if got == expected:
            print(f"self-test ok: {label}: {expected if expected else 'no difference (as expected)'}")
        else:
            ok = False
            print(f"SELF-TEST FAILED: {label}: expected {expected}, got {got}")
    return ok


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ours", help="encoded FileDescriptorSet of our .proto files")
    parser.add_argument("--self-test", action="store_true", help="also check that mutations are caught")
    parser.add_argument("--verbose", action="store_true", help="list every ignored option occurrence")
    args = parser.parse_args(argv)

    upstream = load_upstream()
    ours = load_ours(args.ours)
    ctx = _run(upstream, ours)

    grouped: dict[tuple[str, str], list[str]] = {}
    for side, what, path in ctx.ignored:
        grouped.setdefault((side, what), []).append(path)
    for (side, what), paths in sorted(grouped.items()):
        print(f"ignored (wire-neutral): {side}: {what} (x{len(paths)})")
        if args.verbose:
            for p in paths:
                print(f"    {p}")
    for a in ctx.allowed:
        print(f"allowed (optional on the wire): {a}")
    skipped = sorted(f.name for f in ours if f.name.startswith(IMPORT_ONLY_PREFIX))
    if skipped:
        print(f"not compared (well-known imports): {', '.join(skipped)}")

    if ctx.diffs:
        print("differences (upstream != ours):")
        for d in ctx.diffs:
            print(d)
        print(f"descriptor conformance: FAILED, {len(ctx.diffs)} difference(s)")
        return 1

    s = ctx.stats
    print(
        f"descriptor conformance: {s['files']} files, {s['messages']} messages, "
        f"{s['fields']} fields, {s['services']} services identical"
    )
    print(f"  (also identical: {s['enums']} enums, {s['enum values']} enum values, {s['rpcs']} rpcs)")

    if args.self_test:
        if not self_test(upstream, ours):
            print("self-test: FAILED (a mutation was not reported exactly)")
            return 1
        print(f"self-test: all {len(SELF_TEST_MUTATIONS)} mutations reported exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
