"""Strict offline validation of rendered Kubernetes manifests (run by `cargo xtask manifests`).

Usage: python manifests_validate.py VERSIONS FILE...   (VERSIONS: comma-separated, e.g.
1.29.0,1.34.0). Each FILE is one rendered kustomize target (`kubectl kustomize DIR`) or a
file of sample objects.

- Built-in kinds: kubernetes-validate's strict schemas (unknown fields are errors) for every
  Kubernetes version given. A kind without a schema in a version is an error, not the tool's
  warning.
- Custom resources of the CRDs found in the files: the CRD's openAPIV3Schema, made strict
  (no unknown fields where the schema lists properties and does not preserve unknown
  fields); the CEL rules (x-kubernetes-validations) are not evaluated here.
- Our own rules, which the schemas cannot express: no Service of type NodePort or
  LoadBalancer exposes a metrics port; no Service port of the controller's or the router's
  gRPC listeners (container ports controller-grpc and router, 8082 and 8083: TLS only)
  claims a cleartext application protocol; a Service's named targetPort and a probe's named
  port exist in the pods it selects.

Prints one line per file and every error; exits 1 when there is any error.
"""

import copy
import functools
import sys

import jsonschema
import yaml
from kubernetes_validate import utils

CLEARTEXT = {"h2c", "kubernetes.io/h2c", "http", "http2", "grpc", "kubernetes.io/ws"}
TLS_PORTS = {"controller-grpc", "router", 8082, 8083}
EXPOSED = {"NodePort", "LoadBalancer"}

# The tool reads each schema file again for every object; the same few files serve them all.
utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)


def name_of(obj):
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return "%s %s%s" % (obj.get("kind"), ns + "/" if ns else "", meta.get("name"))


def strict(schema):
    """The schema with additionalProperties: false wherever properties are listed."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def crd_schemas(objects):
    """(group/version, kind) -> strict openAPIV3Schema of every served version."""
    out = {}
    for o in objects:
        if o.get("kind") != "CustomResourceDefinition":
            continue
        spec = o.get("spec") or {}
        for v in spec.get("versions") or []:
            schema = ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
            if v.get("served", True):
                key = ("%s/%s" % (spec.get("group"), v.get("name")), spec["names"]["kind"])
                out[key] = strict(schema)
    return out


def selected_pods(service, objects):
    sel = (service.get("spec") or {}).get("selector") or {}
    if not sel:
        return []
    pods = []
    for o in objects:
        tmpl = ((o.get("spec") or {}).get("template")) or {}
        labels = ((tmpl.get("metadata") or {}).get("labels")) or {}
        if o.get("kind") in ("Deployment", "StatefulSet", "DaemonSet") and all(
            labels.get(k) == v for k, v in sel.items()
        ):
            pods.append(tmpl.get("spec") or {})
    return pods


def port_names(pod):
    return {
        p.get("name")
        for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])
        for p in (c.get("ports") or [])
        if p.get("name")
    }


def lint(objects):
    errors = []
    for o in objects:
        if o.get("kind") == "Service":
            spec = o.get("spec") or {}
            pods = selected_pods(o, objects)
            for p in spec.get("ports") or []:
                label = "%s port %s" % (name_of(o), p.get("name") or p.get("port"))
                if spec.get("type") in EXPOSED and "metrics" in (
                    str(p.get("name")),
                    str(p.get("targetPort")),
                ):
                    errors.append(
                        "%s: metrics exposed outside the cluster (type %s)" % (label, spec["type"])
                    )
                if p.get("appProtocol") in CLEARTEXT and p.get("targetPort", p.get("port")) in TLS_PORTS:
                    errors.append(
                        "%s: appProtocol %s, but the listener speaks TLS"
                        % (label, p["appProtocol"])
                    )
                target = p.get("targetPort")
                if isinstance(target, str) and pods and not any(
                    target in port_names(pod) for pod in pods
                ):
                    errors.append("%s: targetPort %s is no container port it selects" % (label, target))
        tmpl = ((o.get("spec") or {}).get("template") or {}).get("spec")
        if o.get("kind") == "Deployment" and tmpl:
            names = port_names(tmpl)
            for c in tmpl.get("containers") or []:
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    for how in ("tcpSocket", "httpGet", "grpc"):
                        port = ((c.get(probe) or {}).get(how) or {}).get("port")
                        if isinstance(port, str) and port not in names:
                            errors.append(
                                "%s container %s: %s port %s is no container port"
                                % (name_of(o), c.get("name"), probe, port)
                            )
    return errors


def main():
    versions = sys.argv[1].split(",")
    files = sys.argv[2:]
    loaded = {}
    for f in files:
        with open(f) as fh:
            loaded[f] = [d for d in yaml.safe_load_all(fh) if d]
    crds = crd_schemas([o for objs in loaded.values() for o in objs])
    failed = 0
    for f, objects in loaded.items():
        errors = []
        custom = 0
        for o in objects:
            if not isinstance(o, dict) or "apiVersion" not in o or "kind" not in o:
                errors.append("a document without apiVersion and kind: %r" % (o,))
                continue
            key = (o["apiVersion"], o["kind"])
            if key in crds:
                custom += 1
                v = jsonschema.Draft202012Validator(crds[key])
                for e in sorted(v.iter_errors(o), key=lambda e: list(e.path)):
                    path = ".".join(str(p) for p in e.path)
                    errors.append("%s (our CRD): %s: %s" % (name_of(o), path, e.message))
                continue
            if o["apiVersion"].split("/")[0].endswith("jumpstarter.dev"):
                errors.append("%s: %s is none of our CRDs" % (name_of(o), o["apiVersion"]))
                continue
            # The same error in several versions is one line naming them.
            found = {}
            for version in versions:
                try:
                    utils.validate(o, version, strict=True)
                except utils.ValidationError as e:
                    path = ".".join(str(p) for p in e.path)
                    found.setdefault("%s: %s" % (path, e.message), []).append(e.version)
                except utils.SchemaNotFoundError as e:
                    found.setdefault(e.message, []).append(version)
                except utils.VersionNotSupportedError as e:
                    found.setdefault(e.message, []).append(version)
            for what, where in found.items():
                errors.append("%s (Kubernetes %s): %s" % (name_of(o), ", ".join(where), what))
        errors.extend(lint(objects))
        builtin = len(objects) - custom
        print(
            "%s: %d objects (%d of built-in kinds, %d custom resources): %s"
            % (f, len(objects), builtin, custom, "ok" if not errors else "%d error(s)" % len(errors))
        )
        for e in errors:
            print("  ERROR " + e)
        failed += len(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
