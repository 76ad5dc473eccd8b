"""The container and deployment files say what the service needs: non-root, probes on
/healthz and /readyz, the database URL from a secret, PostgreSQL in compose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load(path: str) -> Any:
    file = ROOT / path
    if not file.exists():
        pytest.skip(f"{path} is not in this checkout")
    return yaml.safe_load(file.read_text())


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert "HEALTHCHECK" in text and "/readyz" in text


def test_compose_runs_hetplan_on_postgresql() -> None:
    services = load("deploy/compose.yaml")["services"]
    assert services["postgres"]["image"].startswith("postgres")
    hetplan = services["hetplan"]
    assert hetplan["environment"]["HETPLAN_DATABASE_URL"].startswith("postgresql://")
    assert hetplan["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert all(port.startswith("127.0.0.1:") for port in hetplan["ports"])


def test_kubernetes_deployment_probes_and_secret() -> None:
    spec = load("deploy/k8s/deployment.yaml")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in container["env"]}
    assert env["HETPLAN_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "hetplan"
    assert env["HETPLAN_TOKENS"]["valueFrom"]["secretKeyRef"]["key"] == "tokens"
    assert spec["securityContext"]["runAsNonRoot"] is True
    secret = load("deploy/k8s/secret.example.yaml")
    assert set(secret["stringData"]) == {"database-url", "tokens"}


def test_compose_runs_api_replicas_and_workers_apart() -> None:
    services = load("deploy/compose.yaml")["services"]
    assert services["hetplan"]["environment"]["HETPLAN_EMBEDDED_WORKER"] == "false"
    worker = services["worker"]
    assert worker["command"] == ["hetplan", "worker"]
    assert worker["environment"]["HETPLAN_DATABASE_URL"] == \
        services["hetplan"]["environment"]["HETPLAN_DATABASE_URL"]
    assert "ports" not in worker


def test_kubernetes_runs_workers_as_their_own_deployment() -> None:
    assert "worker.yaml" in load("deploy/k8s/kustomization.yaml")["resources"]
    api = load("deploy/k8s/deployment.yaml")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HETPLAN_EMBEDDED_WORKER", "value": "false"} in api["env"]
    spec = load("deploy/k8s/worker.yaml")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["args"] == ["hetplan", "worker"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HETPLAN_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "hetplan"
    assert spec["securityContext"]["runAsNonRoot"] is True
