"""deploy/ manifests validate and agree with the image."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from inference.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KSERVE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
KSERVE_V2 = ROOT / "deploy" / "kserve" / "inferenceservice-v2.yaml"
NOT_SETTINGS = {"PROMETHEUS_MULTIPROC_DIR", "STORAGE_URI"}  # read by prometheus-client and KServe's initializer


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources() -> dict[str, dict]:
    return {doc["kind"]: doc for path in KUBERNETES for doc in documents(path)}


@pytest.mark.parametrize("path", KUBERNETES, ids=lambda p: p.name)
def test_each_manifest_is_valid_against_the_kubernetes_schemas(path):
    for doc in documents(path):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_a_misspelled_field_is_caught():  # the check above can fail
    deployment = resources()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/ready"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_kserve_predictor_holds_valid_containers():
    service = documents(KSERVE)[0]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    containers = service["spec"]["predictor"]["containers"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"}, "spec": {"containers": containers}}
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    assert containers[0]["name"] == "kserve-container"  # the name KServe routes to


def test_the_kserve_v2_runtime_serves_the_model_its_service_names_over_the_v2_protocol():
    """The ServingRuntime declares v2 and runs the image with the service's settings; the InferenceService names the
    runtime with protocolVersion v2, and the served model's name is the InferenceService's (KServe's model name)."""
    runtime, service = documents(KSERVE_V2)
    assert runtime["kind"] == "ServingRuntime" and runtime["spec"]["protocolVersions"] == ["v2"]
    containers = runtime["spec"]["containers"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"}, "spec": {"containers": containers}}
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    env = {e["name"]: e.get("value") for e in containers[0]["env"]}
    assert set(env) - NOT_SETTINGS <= {name.upper() for name in Settings.model_fields}
    model = service["spec"]["predictor"]["model"]
    assert model["protocolVersion"] == "v2" and model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] == runtime["spec"]["supportedModelFormats"][0]["name"]
    assert env["SERVED_MODEL_NAME"] == service["metadata"]["name"] and env["MODEL_ID"] == "/mnt/models"
    probes = {containers[0][p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert probes == {"/v2/health/ready", "/v2/health/live"}
    assert service["spec"]["predictor"]["terminationGracePeriodSeconds"] > float(env["GRACEFUL_SHUTDOWN_S"])


def test_the_manifests_agree_with_the_image_and_the_service():
    containerfile = (ROOT / "Containerfile").read_text()
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)$", containerfile, re.M).group(1).split()}
    user = int(re.search(r"^USER (\d+):", containerfile, re.M).group(1))
    kinds = resources()
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in server["env"] if "valueFrom" in e}
    assert secrets == {"API_KEY": secrets["API_KEY"]} and secrets["API_KEY"]["optional"]  # a key only with a Secret
    settings = {name.upper() for name in Settings.model_fields}
    kserve_env = {e["name"] for c in documents(KSERVE)[0]["spec"]["predictor"]["containers"] for e in c["env"]}
    assert (set(env) | kserve_env) - NOT_SETTINGS <= settings, "every variable is a setting the service reads"
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert set(ports.values()) == exposed and ports["metrics"] == int(env["PROMETHEUS_PORT"])
    assert pod["securityContext"]["runAsUser"] == user and server["securityContext"]["readOnlyRootFilesystem"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    assert pod["terminationGracePeriodSeconds"] > float(env["GRACEFUL_SHUTDOWN_S"])  # the drain ends before SIGKILL
    predictor = documents(KSERVE)[0]["spec"]["predictor"]
    kserve = {e["name"]: e.get("value") for e in predictor["containers"][0]["env"]}
    assert predictor["terminationGracePeriodSeconds"] > float(kserve["GRACEFUL_SHUTDOWN_S"])
    assert kserve["API_METRICS"] == "false" and "API_KEY" in kserve
    probes = [c[p] for c in (server, predictor["containers"][0]) for p in c if p.endswith("Probe")]
    assert len(probes) == 5 and all(probe["timeoutSeconds"] <= 3 for probe in probes)
    assert env["API_METRICS"] == "false" and [p["targetPort"] for p in kinds["Service"]["spec"]["ports"]] == ["http"]
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    assert mounts["model"]["readOnly"] and mounts["model"]["mountPath"] == env["MODEL_ID"]
    assert mounts["tmp"]["mountPath"] == "/tmp" and env["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/")
    Settings(**{k.lower(): v for k, v in env.items() if k not in NOT_SETTINGS})  # values the service accepts
