#!/usr/bin/env python3
"""Checks docker/k8s's manifests against each other and writes the pod that
docker/smoke.sh plays with `podman kube play`.

Checked offline: the DaemonSet's template is pod.yaml's pod (labels,
annotations and spec; the template adds only its node selector), its
selector picks its template, the ConfigMap the pod mounts is
configmap.yaml's and its TOML parses and asks for hugepages, the
Prometheus annotation names the container's metrics port and the
configuration serves it, and the probe asks for the stack the
configuration names.

The pod written (`--out`) is the one made from the DaemonSet's template,
changed only where podman 4.3 on one host differs from a cluster: the
image is the one the smoke test built, the HugePages emptyDir (a plain
folder under podman) becomes the host's hugetlbfs mount, the vhost-user
folder is the test's own, the pod gets the test's name, and the
container's port list goes (a pod without a network, as the test plays
it, cannot have podman map ports; the metrics port is not scraped here).
"""
import argparse
import copy
import sys
import tomllib

import yaml

HERE = __file__.rsplit("/", 1)[0]


def load(folder, name):
    with open(f"{folder}/{name}") as f:
        return yaml.safe_load(f)


def fail(why):
    print(f"docker/k8s: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--vhost-dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dir", default=HERE, help="where the manifests are (the smoke test's negative control)")
    a = ap.parse_args()
    pod, ds, cm = (load(a.dir, n) for n in ("pod.yaml", "daemonset.yaml", "configmap.yaml"))
    if (pod["kind"], ds["kind"], cm["kind"]) != ("Pod", "DaemonSet", "ConfigMap"):
        fail("pod.yaml, daemonset.yaml and configmap.yaml hold a Pod, a DaemonSet and a ConfigMap")

    template = ds["spec"]["template"]
    spec = copy.deepcopy(template["spec"])
    if "nodeSelector" not in spec:
        fail("the DaemonSet's template has no node selector")
    del spec["nodeSelector"]
    if spec != pod["spec"]:
        fail("the DaemonSet's template spec is not pod.yaml's")
    for key in ("labels", "annotations"):
        if template["metadata"].get(key) != pod["metadata"].get(key):
            fail(f"the DaemonSet's template {key} are not pod.yaml's")
    if ds["spec"]["selector"]["matchLabels"].items() - template["metadata"]["labels"].items():
        fail("the DaemonSet's selector does not pick its template")

    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    config = volumes["config"]["configMap"]["name"]
    if config != cm["metadata"]["name"]:
        fail(f"the pod mounts ConfigMap {config}, configmap.yaml is {cm['metadata']['name']}")
    toml = tomllib.loads(cm["data"]["spate.toml"])
    if toml.get("hugepages") != "on":
        fail("the configuration must ask for hugepages (hugepages = \"on\")")
    if volumes["hugepages"].get("emptyDir", {}).get("medium") != "HugePages":
        fail("the hugepages volume is an emptyDir of medium HugePages")
    port = int(template["metadata"]["annotations"]["prometheus.io/port"])
    if toml.get("metrics", "").rsplit(":", 1)[-1] != str(port):
        fail(f"the configuration does not serve metrics on the annotated port {port}")
    if port not in [p["containerPort"] for p in container["ports"]]:
        fail(f"the container does not declare the metrics port {port}")
    probe = container["readinessProbe"]["exec"]["command"]
    if probe[-2:] != ["--name", toml.get("name")]:
        fail(f"the probe {probe} does not ask for the stack the configuration names")
    device = toml["ports"][0]["device"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "vhost-user")
    if f"path={mount}/" not in device:
        fail(f"the port's socket ({device}) is not in the vhost-user mount {mount}")

    # The pod podman plays.
    out = {"apiVersion": "v1", "kind": "Pod",
           "metadata": copy.deepcopy(template["metadata"]), "spec": copy.deepcopy(spec)}
    out["metadata"]["name"] = a.name
    out["spec"]["containers"][0]["image"] = a.image
    del out["spec"]["containers"][0]["ports"]
    for v in out["spec"]["volumes"]:
        if v["name"] == "hugepages":
            v.pop("emptyDir")
            v["hostPath"] = {"path": "/dev/hugepages", "type": "Directory"}
        elif v["name"] == "vhost-user":
            v["hostPath"]["path"] = a.vhost_dir
    with open(a.out, "w") as f:
        yaml.safe_dump(out, f, sort_keys=False)
    print(f"docker/k8s: the DaemonSet's template is pod.yaml's pod; ConfigMap {config} parses; wrote {a.out}")


if __name__ == "__main__":
    main()
