"""deploy/: every Kubernetes manifest valid against the Kubernetes API schemas (kubernetes-validate,
strict: unknown fields are errors), the Kustomize base complete, and every flag the manifests and
the Dockerfile pass is one the commands take. No cluster is needed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
MANIFESTS = sorted([*KUBERNETES.glob("*.yaml"), *KUBERNETES.glob("jobs/*.yaml")])
# The oldest Kubernetes the manifests target (gRPC probes and backoffLimitPerIndex are GA/beta there)
# and the newest the validator knows.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def resources() -> list[tuple[str, dict]]:
    out = []
    for path in MANIFESTS:
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            out.append((f"{path.relative_to(KUBERNETES)}:{doc['kind']}", doc))
    return out


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), resources(), ids=[n for n, _ in resources()])
def test_each_manifest_is_valid_against_the_kubernetes_schemas(name: str, doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_catches_a_wrong_field() -> None:
    doc = yaml.safe_load((KUBERNETES / "tulip-service.yaml").read_text())
    doc["spec"]["clusterIp"] = "None"  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def test_the_kustomization_lists_every_base_manifest() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    base = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == base
    images = {i["name"] for i in kustomization["images"]}
    deployments = [d for _, d in resources() if d["kind"] == "Deployment"]
    used = {c["image"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]}
    assert used == images


def test_the_probes_and_discovery_fit_the_servers() -> None:
    docs = dict(resources())
    service = docs["tulip-service.yaml:Service"]["spec"]
    assert service["clusterIP"] == "None"  # headless: one address per worker
    tulip = docs["tulip-deployment.yaml:Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert tulip["readinessProbe"]["grpc"]["service"] == "tulip.v1.Tulip"
    assert tulip["resources"]["requests"]["nvidia.com/gpu"] == 1
    ivy = docs["ivy-deployment.yaml:Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert ivy["readinessProbe"]["httpGet"]["path"] == "/health"
    port = service["ports"][0]["port"]
    assert f"http://{docs['tulip-service.yaml:Service']['metadata']['name']}:{port}" in ivy["args"]


def flags_of(command: str) -> set[str]:
    help_text = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=120).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))


def test_every_flag_in_the_manifests_is_one_the_command_takes() -> None:
    for _, doc in resources():
        spec = doc["spec"]["template"]["spec"] if "template" in doc.get("spec", {}) else None
        if spec is None:
            continue
        for container in spec["containers"]:
            command = (container.get("command") or ["ivy-serve"])[0]
            words = " ".join(container.get("args", []))
            if command == "sh":
                command = re.search(r"exec (\S+)", words).group(1)
            passed = set(re.findall(r"(--[a-z][a-z0-9-]*)", words))
            assert passed <= flags_of(command), (command, passed - flags_of(command))


def test_the_image_starts_ivy_serve_from_the_wheel() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM nvidia/cuda:\S+-runtime-", dockerfile, re.M)
    assert 'ENTRYPOINT ["ivy-serve"]' in dockerfile
    assert "COPY *.whl" in dockerfile
