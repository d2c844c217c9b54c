"""The local Batch MNP rehearsal, with plain debian:bookworm containers (no entrypoint)."""

from __future__ import annotations

import re

import pytest

from matrix.errors import UserError
from matrix.jobs.rehearse import LABEL, batch_environment, rehearse, start_order

pytestmark = pytest.mark.docker


class Recorder:
    """Collects log lines and knows the rehearsal's run id once it is announced."""

    def __init__(self, interrupt_on: str | None = None) -> None:
        self.lines: list[str] = []
        self.interrupt_on = interrupt_on

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.interrupt_on and line.startswith(self.interrupt_on):
            self.interrupt_on = None
            raise KeyboardInterrupt

    @property
    def run_id(self) -> str:
        for line in self.lines:
            match = re.match(r"rehearsal (\w+):", line)
            if match:
                return match[1]
        raise AssertionError(f"no run id in {self.lines}")


def _leftovers(client, run_id: str) -> list:
    selector = {"label": f"{LABEL}={run_id}"}
    return client.containers.list(all=True, filters=selector) + client.networks.list(
        filters=selector
    )


def _run(client, image, command, tmp_path, nodes=3, **kwargs):
    log = kwargs.pop("log", None) or Recorder()
    kwargs.setdefault("late_delay_s", 0.5)
    kwargs.setdefault("stop_timeout_s", 1)
    status = rehearse(
        client,
        image,
        nodes,
        command,
        kwargs.pop("late_node", None),
        kwargs.pop("env", {}),
        log,
        log_dir=tmp_path / "logs",
        **kwargs,
    )
    return status, log


@pytest.mark.parametrize(
    ("command", "status"), [(["sh", "-c", "sleep 1"], 0), (["sh", "-c", "sleep 1; false"], 1)]
)
def test_exit_status_is_the_main_nodes_and_nothing_is_left(
    docker_client, base_image, tmp_path, command, status
):
    result, log = _run(docker_client, base_image, command, tmp_path)
    assert result == status
    assert _leftovers(docker_client, log.run_id) == []
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "node0.log",
        "node1.log",
        "node2.log",
    ]


@pytest.mark.parametrize(("command", "status"), [(["true"], 0), (["false"], 1)])
def test_a_main_that_ends_at_once_ends_the_job(
    docker_client, base_image, tmp_path, command, status
):
    result, log = _run(docker_client, base_image, command, tmp_path)
    assert result == status
    assert _leftovers(docker_client, log.run_id) == []
    assert (tmp_path / "logs" / "node0.log").exists()


def test_batch_variables_secret_and_order(docker_client, base_image, tmp_path):
    script = (
        "env | grep -E '^(AWS_BATCH|MNP_|EXTRA)' | sort; "
        'if [ "$AWS_BATCH_JOB_NODE_INDEX" = 0 ]; then sleep 2; exit 7; fi; sleep 60'
    )
    status, log = _run(
        docker_client,
        base_image,
        ["sh", "-c", script],
        tmp_path,
        nodes=4,
        late_node=2,
        env={"EXTRA": "yes"},
    )
    assert status == 7
    assert _leftovers(docker_client, log.run_id) == []

    main_ip = re.search(r"node 0 \(main\) started at (\S+)", "\n".join(log.lines))[1]
    started = [int(m[1]) for line in log.lines if (m := re.match(r"node (\d+) started$", line))]
    assert sorted(started) == [1, 2, 3] and started[-1] == 2  # the late node comes last
    assert any("held back" in line for line in log.lines)
    assert "AWS_BATCH_JOB_NUM_NODES=4" in log.lines  # the main's output was streamed

    envs = {}
    for index in range(4):
        text = (tmp_path / "logs" / f"node{index}.log").read_text()
        envs[index] = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    for index, env in envs.items():
        assert env["AWS_BATCH_JOB_NODE_INDEX"] == str(index)
        assert env["AWS_BATCH_JOB_MAIN_NODE_INDEX"] == "0"
        assert env["AWS_BATCH_JOB_NUM_NODES"] == "4"
        assert env["EXTRA"] == "yes"
        assert env["MNP_SECRET"] == envs[0]["MNP_SECRET"] and len(env["MNP_SECRET"]) == 64
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" not in envs[0]
    assert {envs[i]["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] for i in (1, 2, 3)} == {main_ip}


def test_each_rehearsal_gets_a_new_secret(docker_client, base_image, tmp_path):
    secrets = set()
    for attempt in range(2):
        _run(
            docker_client,
            base_image,
            ["sh", "-c", "echo $MNP_SECRET"],
            tmp_path / str(attempt),
            nodes=1,
        )
        secrets.add((tmp_path / str(attempt) / "logs" / "node0.log").read_text().strip())
    assert len(secrets) == 2


def test_ctrl_c_cleans_up(docker_client, base_image, tmp_path):
    status, log = _run(
        docker_client,
        base_image,
        ["sleep", "60"],
        tmp_path,
        log=Recorder(interrupt_on="node 1 started"),
    )
    assert status == 130
    assert _leftovers(docker_client, log.run_id) == []


def test_timeout_kills_the_main_node(docker_client, base_image, tmp_path):
    status, log = _run(docker_client, base_image, ["sleep", "60"], tmp_path, nodes=2, timeout_s=1)
    assert status == 124
    assert _leftovers(docker_client, log.run_id) == []


def test_start_failure_is_one_line_and_cleans_up(docker_client, base_image, tmp_path):
    log = Recorder()
    with pytest.raises(UserError, match="rehearsal failed: Docker: .*no/such/binary") as failure:
        _run(docker_client, base_image, ["/no/such/binary"], tmp_path, log=log)
    assert "\n" not in str(failure.value)
    assert _leftovers(docker_client, log.run_id) == []


@pytest.mark.parametrize(
    ("nodes", "late", "command", "message"),
    [
        (0, None, ["true"], "--nodes 0"),
        (3, 0, ["true"], "--late-node 0"),
        (3, 3, ["true"], "--late-node 3"),
        (2, None, [], "no command"),
    ],
)
def test_bad_arguments(docker_client, nodes, late, command, message):
    with pytest.raises(UserError, match=message):
        rehearse(docker_client, "debian:bookworm", nodes, command, late, {}, print)


def test_missing_image(docker_client):
    with pytest.raises(UserError, match="not in the local engine"):
        rehearse(docker_client, "mnp-no-such-image:nope", 2, ["true"], None, {}, print)


@pytest.mark.parametrize("nodes", [1, 2, 5])
def test_start_order_puts_the_late_node_last(nodes):
    import random

    late = nodes - 1 if nodes > 1 else None
    order = start_order(nodes, late, random.Random(1))
    assert sorted(order) == list(range(1, nodes))
    if late is not None:
        assert order[-1] == late


def test_batch_environment_main_has_no_main_address():
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" not in batch_environment(0, 2, "r", "x")
    child = batch_environment(1, 2, "r", "10.0.0.2")
    assert child["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] == "10.0.0.2"


# -- issue 31: the nodes' output is the job's, passed on unchanged --------------------------

PAYLOAD = (b"[main 0/3] kept\n[/fsx/ckpt] saved step 100\n[bold]not bold[/bold]\n"
           b"\x1b[31mred\x1b[0m\n\xff\xfe not UTF-8\n" + b"y" * 300 + b"\nno newline at the end")


def payload_command(code: int) -> list[str]:
    """``sh`` printing ``PAYLOAD`` (carried in base64: the bytes are not all text), then
    exiting with ``code``."""
    import base64
    return ["sh", "-c", f"echo {base64.b64encode(PAYLOAD).decode()} | base64 -d; exit {code}"]


def test_the_main_nodes_output_reaches_out_byte_for_byte(docker_client, base_image, tmp_path):
    received = []
    status, log = _run(docker_client, base_image, payload_command(3), tmp_path, nodes=2,
                       out=received.append)
    assert b"".join(received) == PAYLOAD
    assert status == 3  # the job's status, whatever its output held
    assert not [line for line in log.lines if "not UTF-8" in line]  # not through ``log``
