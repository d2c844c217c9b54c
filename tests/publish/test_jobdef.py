"""Batch MNP job definitions, validated with botocore's own Batch model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import validate_parameters

from matrix.errors import UserError
from matrix.jobs.jobdef import WRITER, BatchOptions, pin_image, validate_job_definition
from matrix.jobs.spec import JobSpec, check_pair
from matrix.model.instances import INSTANCE_TYPES, get_instance_type, job_memory_mib
from tests.helpers import job_for, one_line, project_matrix, written, written_for_pair

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cpu-tcp@sha256:" + "a" * 64
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:mnp-rendezvous-AbCdEf"
ROLE = "arn:aws:iam::123456789012:role/mnp-batch-execution"
BATCH = botocore.session.get_session().get_service_model("batch")
REGISTER = BATCH.operation_model("RegisterJobDefinition").input_shape
MATRIX = project_matrix()
COMMAND = ["python3", "train.py"]


def _container(definition: dict) -> dict:
    (node_range,) = definition["nodeProperties"]["nodeRangeProperties"]
    return node_range["container"]


def _env(definition: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in _container(definition)["environment"]}


def _resources(definition: dict) -> dict[str, str]:
    return {item["type"]: item["value"] for item in _container(definition)["resourceRequirements"]}


def jobdef(stack: str, nodes: int, instance_type: str, *options: str,
           command: list[str] = COMMAND) -> dict:
    """What ``invoke jobdef --stack STACK --nodes N --instance-type T --image-uri IMAGE OPTIONS
    -- COMMAND`` writes (tests.helpers.written: the task's own steps, in this process)."""
    return written("jobdef", "--stack", stack, "--nodes", str(nodes), "--instance-type",
                   instance_type, "--image-uri", IMAGE, *options, command=command)


def _stack_for(instance_type: str) -> str:
    """A stack of stacks.yaml the pair check lets run on ``instance_type`` (every row of the
    table has one), an efa stack where the row has EFA, so its devices are passed in."""
    row = get_instance_type(instance_type)
    runs = [stack for stack in MATRIX.stacks.values() if _runs_on(stack, instance_type)]
    efa = [stack for stack in runs if stack.fabric == "efa"]
    return (efa if row.has_efa and efa else runs)[0].name


def _runs_on(stack, instance_type: str) -> bool:
    try:
        check_pair(stack, instance_type)
    except UserError:
        return False
    return True


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_every_instance_type_makes_a_valid_definition(instance_type):
    instance = INSTANCE_TYPES[instance_type]
    stack = MATRIX.stack(_stack_for(instance_type))
    definition = jobdef(stack.name, 4, instance_type, "--secret-arn", SECRET,
                        "--execution-role-arn", ROLE, "--launcher-args", "-x NCCL_DEBUG=INFO")

    validate_parameters(definition, REGISTER)  # raises on any mismatch with the Batch model
    assert definition["type"] == "multinode"
    assert definition["nodeProperties"]["numNodes"] == 4
    assert definition["nodeProperties"]["mainNode"] == 0
    assert definition["nodeProperties"]["nodeRangeProperties"][0]["targetNodes"] == "0:"
    container = _container(definition)
    assert container["image"] == IMAGE
    assert container["instanceType"] == instance_type

    # EFA devices only for an efa stack: a tcp stack on an EFA type gets none
    interfaces = instance.efa_interfaces if stack.fabric == "efa" else 0
    devices = container["linuxParameters"].get("devices", [])
    assert len(devices) == interfaces
    assert [d["hostPath"] for d in devices] == [
        f"/dev/infiniband/uverbs{i}" for i in range(interfaces)
    ]
    assert all(d["containerPath"] == d["hostPath"] for d in devices)
    assert all(d["permissions"] == ["READ", "WRITE", "MKNOD"] for d in devices)
    assert container["linuxParameters"]["sharedMemorySize"] == instance.shm_mib

    resources = _resources(definition)
    assert resources.get("GPU") == (str(instance.gpus) if instance.gpus else None)
    assert resources["VCPU"] == str(instance.vcpus)
    memory = int(resources["MEMORY"])
    assert memory == job_memory_mib(instance)
    assert 0.9 * instance.memory_mib < memory <= 0.95 * instance.memory_mib

    assert {"name": "memlock", "softLimit": -1, "hardLimit": -1} in container["ulimits"]
    assert container["secrets"] == [{"name": "MNP_SECRET", "valueFrom": SECRET}]
    assert container["executionRoleArn"] == ROLE
    env = _env(definition)
    assert "MNP_SECRET" not in env
    assert env["MNP_SLOTS_PER_NODE"] == str(instance.slots_per_node())
    assert env["MNP_FABRIC"] == stack.fabric
    assert env["MNP_LAUNCHER_ARGS"] == "-x NCCL_DEBUG=INFO"
    assert env["MNP_INSTANCE_TYPE"] == instance_type
    assert env["MNP_WAIT_TIMEOUT"] == "600"
    assert env["MNP_LAUNCHER"] == "mpirun"


def test_instance_table_numbers():
    expected_efa = {
        "p3.16xlarge": 0,
        "p3dn.24xlarge": 1,
        "p4d.24xlarge": 4,
        "p5.48xlarge": 32,
        "dl1.24xlarge": 4,
    }
    for name, efa in expected_efa.items():
        row = get_instance_type(name)
        assert row.efa_interfaces == efa
        assert row.source
    assert get_instance_type("p4d.24xlarge").efa_rdma_read
    assert get_instance_type("p5.48xlarge").efa_rdma_read
    assert not get_instance_type("p3dn.24xlarge").efa_rdma_read
    assert get_instance_type("dl1.24xlarge").hpus == 8
    assert get_instance_type("p3.16xlarge").gpus == 8


def test_gaudi_runs_privileged_without_gpu_resource():
    definition = jobdef("synapseai1.6-efa", 2, "dl1.24xlarge", "--launcher", "deepspeed")
    assert _container(definition)["privileged"] is True
    assert "GPU" not in _resources(definition)
    assert _env(definition)["MNP_SLOTS_PER_NODE"] == "8"
    assert _env(definition)["MNP_LAUNCHER"] == "deepspeed"


def test_no_secret_no_secrets_block():
    definition = jobdef("cpu-tcp", 2, "c5n.18xlarge")
    assert "secrets" not in _container(definition)
    assert _env(definition)["MNP_FABRIC"] == "tcp"
    # c5n.18xlarge has an EFA interface, but a tcp job gets no uverbs device
    assert "devices" not in _container(definition)["linuxParameters"]


def test_command_name_and_timeout():
    """The definition's name and per-attempt timeout (BatchOptions) and the nodes' wait bound
    (JobSpec.wait_timeout_s): the writer renders them, though no option of invoke jobdef sets
    them, so the task's job is rendered with them here (JobSpec + Writer.render)."""
    command = ["python", "-m", "allreduce"]
    job = job_for("jobdef", "--stack", "cpu-tcp", "--nodes", "3", "--instance-type",
                  "c5n.18xlarge", "--image-uri", IMAGE, command=command)
    spec = replace(job.spec(IMAGE), wait_timeout_s=120)
    definition = WRITER.render(spec, BatchOptions(name="my-job", attempt_timeout_s=3600))
    assert definition["jobDefinitionName"] == "my-job"
    assert _container(definition)["command"] == ["python", "-m", "allreduce"]
    assert definition["timeout"] == {"attemptDurationSeconds": 3600}
    assert _env(definition)["MNP_WAIT_TIMEOUT"] == "120"
    # the task's own definition: the default name, no timeout, the default wait
    default = job.render(IMAGE)
    assert default["jobDefinitionName"] == "mnp-cpu-tcp-3x-c5n-18xlarge"
    assert "timeout" not in default and _env(default)["MNP_WAIT_TIMEOUT"] == "600"


def test_default_name_is_batch_safe():
    definition = jobdef("cuda11.7-efa", 2, "p4d.24xlarge")
    assert definition["jobDefinitionName"] == "mnp-cuda11-7-efa-2x-p4d-24xlarge"


@pytest.mark.parametrize(("args", "words"), [
    (["--image-uri", "repo/x:latest"], "--image-uri 'repo/x:latest' has no digest"),
    (["--instance-type", "m5.large"],
     "--instance-type 'm5.large': no instance type of that name; did you mean m5.24xlarge?"),
    (["--nodes", "0"], "--nodes 0: expected a whole number from 1 to 10000"),
    (["--secret-arn", SECRET], "--secret-arn needs --execution-role-arn"),
    (["--secret-arn", "not-an-arn", "--execution-role-arn", ROLE],
     "--secret-arn 'not-an-arn' is not a Secrets Manager or SSM parameter ARN"),
    (["--execution-role-arn", "role"], "--execution-role-arn 'role' is not an IAM role ARN"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, args, words):
    target = tmp_path / "job.json"
    typed = dict(zip(PAIR[::2], PAIR[1::2])) | dict(zip(args[::2], args[1::2]))
    line = one_line(jobdef_cli("--stack", "cpu-tcp", *[word for item in typed.items()
                                                       for word in item],
                               "--output", str(target), command=["true"]), 2)
    assert words in line
    assert not target.exists()


@pytest.mark.parametrize(("env", "fabric", "message"), [
    ({"AWS_BATCH_JOB_ID": "x"}, None, r"^environment variable AWS_BATCH_JOB_ID: .*reserved"),
    ({"MNP_SECRET": "x"}, None, r"--secret-arn"),
    ({"1BAD": "x"}, None, r"^environment variable '1BAD': not a valid variable name"),
    ({}, "efa", r"^fabric efa: p3.16xlarge has no EFA"),
])
def test_a_job_spec_refuses_variables_and_a_fabric_no_writer_may_write(env, fabric, message):
    """Variables beyond the MNP_* settings and a fabric other than the stack's reach a JobSpec
    from no option of any task (invoke jobdef's come from its options' declared variables, its
    fabric from the stack, which the pair check holds to the instance), but every writer renders
    only a spec that passed these checks. So the refusals name the variable and the fabric,
    not an option no task has (``--env``, ``--fabric``)."""
    stack = MATRIX.stack("cuda10.1-tcp")
    with pytest.raises(UserError, match=message) as failure:
        replace(JobSpec.of(stack, "p3.16xlarge", 2, IMAGE, "mpirun", COMMAND, env=env),
                fabric=fabric or stack.fabric)
    assert "\n" not in str(failure.value)


def test_validation_uses_the_batch_model():
    definition = jobdef("cuda11.7-efa", 2, "p4d.24xlarge")
    definition["nodeProperties"]["numNodes"] = "two"
    with pytest.raises(UserError, match="numNodes"):
        validate_job_definition(definition)
    definition["nodeProperties"]["numNodes"] = 2
    _container(definition)["linuxParameters"]["devices"][0]["permissions"] = ["EXECUTE"]
    with pytest.raises(UserError, match="permissions"):
        validate_job_definition(definition)


def test_pinned_image_passes_through_without_a_client():
    assert pin_image(IMAGE) == IMAGE
    with pytest.raises(UserError, match="has no digest"):
        pin_image("repo/x:tag")


@pytest.mark.docker
def test_tag_is_resolved_to_the_registry_digest(docker_client, chain, registry, tmp_path):
    from matrix.deploy.publish import push_stack

    result = push_stack(
        docker_client,
        chain.layer_refs,
        chain.final_ref,
        chain.stack,
        registry.host,
        "abc1234",
        force=True,
        log=lambda line: None,
        state_dir=tmp_path,
    )
    pinned = pin_image(f"{registry.host}/{chain.repo}:{chain.stack}", docker_client)
    assert pinned == result.image_digest_uri
    definition = written("jobdef", *PAIR[:4], "--stack", "cpu-tcp", "--image-uri", pinned,
                         command=COMMAND)
    assert _container(definition)["image"] == pinned
    with pytest.raises(UserError, match="cannot resolve its digest"):
        pin_image(f"{registry.host}/{chain.repo}:no-such-tag", docker_client)


# --- every (stack, instance) pair stacks.yaml declares, from the one instance table -------------

PAIRS = [(name, instance) for name, stack in MATRIX.stacks.items() for instance in stack.instances]


def test_declared_pairs_include_the_types_jobdef_used_to_refuse():
    assert {"c6i.32xlarge", "m5.24xlarge", "hpc6a.48xlarge", "p4de.24xlarge"} <= {
        instance for _, instance in PAIRS}


@pytest.mark.parametrize(("stack", "instance_type"), PAIRS, ids=[f"{s}@{i}" for s, i in PAIRS])
def test_every_declared_pair_makes_a_valid_definition(stack, instance_type):
    s = MATRIX.stack(stack)
    row = get_instance_type(instance_type)
    definition = written_for_pair("jobdef", "--stack", stack, "--nodes", "2", "--instance-type",
                                  instance_type, "--image-uri", IMAGE, "--secret-arn", SECRET,
                                  "--execution-role-arn", ROLE, command=COMMAND)
    validate_parameters(definition, REGISTER)
    container = _container(definition)
    assert container["instanceType"] == instance_type
    assert _env(definition)["MNP_FABRIC"] == s.fabric
    # EFA devices only for an efa stack: a tcp stack on an EFA type gets none
    expected = row.efa_interfaces if s.fabric == "efa" else 0
    assert len(container["linuxParameters"].get("devices", [])) == expected
    assert _resources(definition).get("GPU") == (str(row.gpus) if row.gpus else None)
    assert container.get("privileged", False) == bool(row.hpus)


@pytest.mark.parametrize(("stack", "instance_type", "rule"), [
    ("cuda11.7-efa", "c5n.18xlarge", "cuda-stack-needs-gpu-instance"),
    ("cuda10.1-tcp", "m5.24xlarge", "cuda-stack-needs-gpu-instance"),
    ("cuda12.1-efa", "p3.16xlarge", "efa-fabric-needs-efa-instance"),
    ("cpu-tcp", "hpc6a.48xlarge", None),
    ("synapseai1.6-efa", "p4d.24xlarge", "gaudi-stack-needs-gaudi-instance"),
    ("cpu-mpi", "m5.24xlarge", None),
    ("cpu-tcp", "p4d.24xlarge", "gpu-instance-needs-cuda-stack"),  # GPUs held, none used
    ("cpu-mpi", "dl1.24xlarge", "gaudi-instance-needs-synapseai-stack"),
])
def test_a_pair_the_table_says_cannot_work_is_refused(stack, instance_type, rule):
    words = ("--stack", stack, "--nodes", "2", "--instance-type", instance_type, "--image-uri",
             IMAGE)
    if rule is None:  # a CPU stack runs on any CPU instance
        job_for("jobdef", *words, command=COMMAND)
        return
    with pytest.raises(UserError) as failure:
        job_for("jobdef", *words, command=COMMAND)
    message = str(failure.value)
    assert f"stack {stack} cannot run on {instance_type}" in message and rule in message
    assert "\n" not in message


def test_jobdef_command_refuses_a_gpu_stack_on_a_cpu_instance(tmp_path):
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "invoke", "jobdef", "--stack", "cuda11.7-efa",
                           "--nodes", "2", "--instance-type", "m5.24xlarge", "--image-uri", IMAGE,
                           "--output", str(tmp_path / "job.json"), "--", "python3", "train.py"],
                          cwd=root, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "cuda-stack-needs-gpu-instance" in proc.stderr
    assert not (tmp_path / "job.json").exists()


def test_launcher_must_be_an_entrypoint_unit():
    from entrypoint.launchers import NAMES

    for launcher in NAMES:
        definition = jobdef("cpu-tcp", 2, "c5n.18xlarge", "--launcher", launcher)
        env = definition["nodeProperties"]["nodeRangeProperties"][0]["container"]["environment"]
        assert {"name": "MNP_LAUNCHER", "value": launcher} in env
    line = one_line(jobdef_cli("--stack", "cpu-tcp", *PAIR, "--launcher", "horovodrun",
                               command=["true"]), 2)
    assert "--launcher 'horovodrun': no launcher of that name" in line


# --- invoke jobdef as users call it (issue 16) -------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# no engine, no AWS configuration, no instance metadata: what a fresh laptop has
NO_AWS = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "AWS_CONFIG_FILE": "/nonexistent",
          "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}
EXIT3 = ["python3", "-c", "import sys; sys.exit(3)"]


def jobdef_cli(*args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")}
    env.update(NO_AWS)
    tail = ["--", *command] if command else []
    return subprocess.run([sys.executable, "-m", "invoke", "jobdef", *args, *tail], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env, check=False)


PAIR = ["--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE]


def test_jobdef_writes_the_command_word_for_word(tmp_path):
    target = tmp_path / "job.json"
    proc = jobdef_cli(*PAIR, "--output", str(target), command=EXIT3)
    assert proc.returncode == 0, proc.stderr
    definition = json.loads(target.read_text())
    assert _container(definition)["command"] == EXIT3
    validate_parameters(definition, REGISTER)
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]  # no temporary file left


def test_jobdef_without_a_command_says_how_to_give_one(tmp_path):
    line = one_line(jobdef_cli(*PAIR, "--output", str(tmp_path / "job.json")), 2)
    assert "give the training command after --" in line and "-- python3 train.py" in line
    assert not (tmp_path / "job.json").exists()


@pytest.mark.parametrize(("output", "words"), [
    ("/nonexistent/x.json", "--output /nonexistent/x.json: no folder /nonexistent"),
    ("{tmp}", "--output {tmp}: a folder; give a file name"),
])
def test_jobdef_output_that_cannot_be_a_file_is_one_line(tmp_path, output, words):
    output = output.format(tmp=tmp_path)
    assert words.format(tmp=tmp_path) in one_line(jobdef_cli(*PAIR, "--output", output,
                                                             command=["true"]), 2)
    assert list(tmp_path.iterdir()) == []


def test_jobdef_output_in_an_unwritable_folder_is_one_line():
    # /proc takes no new files, even for root
    assert "--output /proc/job.json: cannot write in /proc" in one_line(
        jobdef_cli(*PAIR, "--output", "/proc/job.json", command=["true"]), 1)


@pytest.mark.parametrize(("extra", "words"), [
    ([], "no AWS region for --register: pass --region"),
    (["--profile", "nope"], "--profile 'nope': no AWS profile of that name"),
    # with a region the request is made, and fails for want of credentials: one line too
    (["--region", "us-east-1"], "Batch RegisterJobDefinition failed: Unable to locate credentials"),
])
def test_jobdef_register_without_aws_configuration_is_one_line(tmp_path, extra, words):
    target = tmp_path / "job.json"
    line = one_line(jobdef_cli(*PAIR, "--register", *extra, "--output", str(target),
                               command=["true"]), 1)
    assert words in line
    # a region or profile problem is found before anything is written
    assert target.exists() == (extra[:1] == ["--region"])


@pytest.mark.parametrize(("args", "words"), [
    (["--stack", "cpu-mpi", "--launcher", "deepspeed", "--instance-type", "c5n.18xlarge"],
     "deepspeed not found on PATH"),
    (["--stack", "cpu-mpi", "--launcher", "torchrun", "--instance-type", "c5n.18xlarge"],
     "torchrun needs PyTorch"),
    (["--stack", "cpu-tcp", "--instance-type", "p4d.24xlarge"],
     "stack cpu-tcp cannot run on p4d.24xlarge under AWS Batch: instance p4d.24xlarge (gpus 8) "
     "needs cuda, it is missing [rule gpu-instance-needs-cuda-stack]"),
    (["--stack", "cpu-mpi", "--instance-type", "dl1.24xlarge"],
     "instance dl1.24xlarge (hpus 8) needs synapseai, it is missing"),
])
def test_jobdef_refuses_what_explain_calls_a_problem(tmp_path, args, words):
    target = tmp_path / "job.json"
    target.write_text("old\n")
    line = one_line(jobdef_cli(*args, "--nodes", "2", "--image-uri", IMAGE, "--output",
                               str(target), command=["python3", "train.py"]), 1)
    assert words in line
    assert target.read_text() == "old\n"  # nothing written over it


@pytest.mark.docker
@pytest.mark.slow
def test_a_job_definitions_command_fails_the_rehearsed_job(cpu_tcp_image, tmp_path):
    """The job definition's command, run through `invoke run` as Batch would run it, gives its
    exit status back: a failing training script cannot end as a success."""
    target = tmp_path / "job.json"
    proc = jobdef_cli(*PAIR, "--output", str(target), command=EXIT3)
    assert proc.returncode == 0, proc.stderr
    command = _container(json.loads(target.read_text()))["command"]
    run = subprocess.run([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp", "--nodes",
                          "2", "--", *command], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=False)
    assert run.returncode == 3, (run.stdout[-2000:], run.stderr[-2000:])
