"""Issue 16 item 1 (the image half) in real containers of the ``cpu-tcp`` image: the image has no
default command, so a 2-node job whose job definition gives none fails on every node with exit
code 2 and one line saying where the command goes. Before, the image's ``CMD`` printed a hint and
the job succeeded having trained nothing."""

import pytest

pytestmark = [pytest.mark.docker]


def test_the_image_has_no_default_command(docker_client, cluster_image):
    config = docker_client.images.get(cluster_image).attrs["Config"]
    assert config["Entrypoint"] == ["/usr/local/bin/mnp-entrypoint"]
    assert not config.get("Cmd"), config.get("Cmd")


def test_a_job_without_a_command_fails_on_every_node(cluster):
    env = {"MNP_SECRET": "no-command-test", "MNP_WAIT_TIMEOUT": "30"}
    main = cluster.node(0, 2, None, **env)
    child = cluster.node(1, 2, None, main_ip=cluster.ip(main), **env)
    for container in (main, child):
        code = cluster.wait_exit(container, 60)
        text = cluster.logs(container)
        assert code == 2, text
        errors = [line for line in text.splitlines() if "error" in line]
        assert len(errors) == 1 and "no command given" in errors[0], text
        assert "containerProperties.command" in errors[0] and "invoke jobdef" in errors[0]
