#!/usr/bin/env python3
"""Makes the strict JSON schemas kubeconform validates deploy/k8s with, offline.

Source: the Kubernetes OpenAPI definitions (converted to JSON Schema, Apache-2.0) that the
kubeconform module ships as a test fixture, fixtures/cache/6dc6142c… in
github.com/yannh/kubeconform@v0.8.0 (Go module proxy). For each kind below it writes
<kind>[-<group>]-<version>.json (kubeconform's file naming) holding the kind's definition and
every definition it references, with additionalProperties false on every object that lists its
properties (what kubeconform's "-strict" schemas do), so a misspelt field fails validation.
Usage: extract.py <_definitions.json> <out dir>
"""
import json
import sys

KINDS = [
    ("io.k8s.api.apps.v1.Deployment", "deployment-apps-v1"),
    ("io.k8s.api.policy.v1.PodDisruptionBudget", "poddisruptionbudget-policy-v1"),
    ("io.k8s.api.core.v1.Service", "service-v1"),
    ("io.k8s.api.core.v1.Secret", "secret-v1"),
    ("io.k8s.api.core.v1.ConfigMap", "configmap-v1"),
    ("io.k8s.api.core.v1.ServiceAccount", "serviceaccount-v1"),
    ("io.k8s.api.networking.v1.NetworkPolicy", "networkpolicy-networking-v1"),
]


def refs(node, out):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/definitions/"):
            out.add(r[len("#/definitions/"):])
        for v in node.values():
            refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)


def strict(node):
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for v in node.values():
            strict(v)
    elif isinstance(node, list):
        for v in node:
            strict(v)


def main():
    defs = json.load(open(sys.argv[1]))["definitions"]
    for name, file in KINDS:
        need, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n in need:
                continue
            need.add(n)
            found = set()
            refs(defs[n], found)
            todo.extend(found - need)
        schema = {"$ref": "#/definitions/" + name,
                  "definitions": {n: json.loads(json.dumps(defs[n])) for n in sorted(need)}}
        strict(schema["definitions"])
        with open(f"{sys.argv[2]}/{file}.json", "w") as f:
            json.dump(schema, f, indent=None, separators=(",", ":"), sort_keys=True)
            f.write("\n")


main()
