"""Environment parsing: roles, settings, and one clear error per invalid value."""

import pytest

from entrypoint.settings import config

MAIN = {
    "AWS_BATCH_JOB_NODE_INDEX": "0",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
    "AWS_BATCH_JOB_NUM_NODES": "3",
}
CHILD = dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="2",
             AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.0.1.5")


def test_no_batch_variables_is_single_node():
    cfg = config.load({})
    assert cfg.mode == "single"
    assert not cfg.is_multi
    assert cfg.launcher == "mpirun" and not cfg.launcher_explicit
    assert cfg.wait_timeout == 600
    assert cfg.fabric == "auto"
    assert cfg.secret is None
    assert cfg.dry_run is False


def test_main_and_child_roles():
    main = config.load(MAIN)
    assert (main.mode, main.node_index, main.num_nodes) == ("main", 0, 3)
    assert main.main_address is None
    child = config.load(CHILD)
    assert (child.mode, child.node_index, child.main_address) == ("child", 2, "10.0.1.5")
    assert child.role_label() == "child 2/3"


def test_main_index_need_not_be_zero():
    cfg = config.load(dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_MAIN_NODE_INDEX="1"))
    assert cfg.mode == "main" and cfg.main_index == 1


def test_one_node_job_is_single_node():
    cfg = config.load(dict(MAIN, AWS_BATCH_JOB_NUM_NODES="1"))
    assert cfg.mode == "single"


@pytest.mark.parametrize("env,variable", [
    (dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="x"), "AWS_BATCH_JOB_NODE_INDEX"),
    (dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="3"), "AWS_BATCH_JOB_NODE_INDEX"),
    (dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="-1"), "AWS_BATCH_JOB_NODE_INDEX"),
    (dict(MAIN, AWS_BATCH_JOB_MAIN_NODE_INDEX="7"), "AWS_BATCH_JOB_MAIN_NODE_INDEX"),
    (dict(MAIN, AWS_BATCH_JOB_NUM_NODES="0"), "AWS_BATCH_JOB_NUM_NODES"),
    (dict(MAIN, AWS_BATCH_JOB_NUM_NODES="two"), "AWS_BATCH_JOB_NUM_NODES"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "0"}, "AWS_BATCH_JOB_MAIN_NODE_INDEX"),
    (dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="1"), "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
    (dict(CHILD, AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="main-node"),
     "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
    (dict(CHILD, AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="127.0.0.1"),
     "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
    ({"MNP_LAUNCHER": "srun"}, "MNP_LAUNCHER"),
    ({"MNP_WAIT_TIMEOUT": "soon"}, "MNP_WAIT_TIMEOUT"),
    ({"MNP_WAIT_TIMEOUT": "0"}, "MNP_WAIT_TIMEOUT"),
    ({"MNP_WAIT_TIMEOUT": "nan"}, "MNP_WAIT_TIMEOUT"),
    ({"MNP_SLOTS_PER_NODE": "0"}, "MNP_SLOTS_PER_NODE"),
    ({"MNP_SLOTS_PER_NODE": "2.5"}, "MNP_SLOTS_PER_NODE"),
    ({"MNP_FABRIC": "ib"}, "MNP_FABRIC"),
    ({"MNP_RENDEZVOUS_PORT": "70000"}, "MNP_RENDEZVOUS_PORT"),
    ({"MNP_SSH_PORT": "0"}, "MNP_SSH_PORT"),
    ({"MNP_SSH_PORT": "29410"}, "MNP_RENDEZVOUS_PORT"),
    ({"MNP_DRY_RUN": "maybe"}, "MNP_DRY_RUN"),
    ({"MNP_SECRET": ""}, "MNP_SECRET"),
    ({"MNP_SECRET": "a", "MNP_SECRET_FILE": "/x"}, "MNP_SECRET_FILE"),
    ({"MNP_SECRET_FILE": "/nonexistent/secret"}, "MNP_SECRET_FILE"),
    ({"MNP_EXPORT_ENV": "GOOD,bad-name"}, "MNP_EXPORT_ENV"),
    ({"MNP_LAUNCHER_ARGS": "--x 'unclosed"}, "MNP_LAUNCHER_ARGS"),
    ({"MNP_NETWORK_INTERFACE": "eth0; rm -rf /"}, "MNP_NETWORK_INTERFACE"),
    ({"MNP_INSTANCE_TYPE": "big"}, "MNP_INSTANCE_TYPE"),
    ({"MNP_STATE_DIR": "relative/dir"}, "MNP_STATE_DIR"),
    ({"MNP_DEEPSPEED_LAUNCHER": "slurm"}, "MNP_DEEPSPEED_LAUNCHER"),
])
def test_invalid_values_name_the_variable(env, variable):
    with pytest.raises(config.ConfigError) as info:
        config.load(env)
    assert info.value.variable == variable
    assert str(info.value).startswith(variable + ":")
    assert "\n" not in str(info.value)


def test_settings_are_parsed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")
    cfg = config.load({
        "MNP_LAUNCHER": "TorchRun",
        "MNP_WAIT_TIMEOUT": "12.5",
        "MNP_SLOTS_PER_NODE": "8",
        "MNP_FABRIC": "tcp",
        "MNP_NETWORK_INTERFACE": "ens5",
        "MNP_SECRET_FILE": str(secret),
        "MNP_RENDEZVOUS_PORT": "4000",
        "MNP_SSH_PORT": "4001",
        "MNP_DRY_RUN": "yes",
        "MNP_EXPORT_ENV": "WANDB_API_KEY, HF_*",
        "MNP_LAUNCHER_ARGS": "--tag-output -x 'A=b c'",
        "MNP_INSTANCE_TYPE": "p4d.24xlarge",
        "MNP_NP": "5",
    })
    assert cfg.launcher == "torchrun" and cfg.launcher_explicit
    assert cfg.wait_timeout == 12.5
    assert cfg.slots_override == 8
    assert cfg.fabric == "tcp"
    assert cfg.interface == "ens5"
    assert cfg.secret == b"s3cr3t"
    assert (cfg.rendezvous_port, cfg.ssh_port) == (4000, 4001)
    assert cfg.dry_run == "text"
    assert config.load({"MNP_DRY_RUN": "json"}).dry_run == "json"
    assert config.load({}).dry_run is False
    assert cfg.export_env == ["WANDB_API_KEY", "HF_*"]
    assert cfg.launcher_args == ["--tag-output", "-x", "A=b c"]
    assert cfg.instance_type == "p4d.24xlarge"
    assert cfg.np_override == 5


def test_inline_secret():
    assert config.load({"MNP_SECRET": "abc"}).secret == b"abc"


def test_empty_values_mean_default():
    cfg = config.load({"MNP_LAUNCHER": "", "MNP_WAIT_TIMEOUT": "", "MNP_DRY_RUN": "0"})
    assert cfg.launcher == "mpirun" and cfg.wait_timeout == 600 and not cfg.dry_run


def test_every_setting_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "entrypoint.md").read_text()
    for name in config.SETTINGS:
        assert f"`{name}`" in doc, name
    for name in ("AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_MAIN_NODE_INDEX",
                 "AWS_BATCH_JOB_NUM_NODES", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"):
        assert f"`{name}`" in doc, name


@pytest.mark.parametrize("name,value,suggestion", [
    ("MNP_LAUCHER", "torchrun", "MNP_LAUNCHER"),
    ("MNP_WAIT_TIMOUT", "60", "MNP_WAIT_TIMEOUT"),
    ("MNP_SLOTS", "8", "MNP_SLOTS_PER_NODE"),
])
def test_a_misspelt_setting_is_an_error_with_a_suggestion(name, value, suggestion):
    """Issue 16 item 4: MNP_ is the entrypoint's namespace, so a typo there is not ignored."""
    with pytest.raises(config.ConfigError) as info:
        config.load({name: value})
    message = str(info.value)
    assert info.value.variable == name and message.startswith(name + ":")
    assert f"did you mean {suggestion}?" in message and "\n" not in message


def test_several_unknown_names_are_all_named_on_one_line():
    with pytest.raises(config.ConfigError) as info:
        config.load({"MNP_B": "1", "MNP_A": "1", "MNP_LAUNCHER": "mpirun"})
    assert str(info.value).startswith("MNP_A:") and "1 more: MNP_B" in str(info.value)


def test_names_the_entrypoint_sets_for_the_command_are_not_errors():
    """An image or a nested run may carry what the entrypoint exports (MNP_HOSTFILE, ...)."""
    cfg = config.load(dict.fromkeys(config.OUTPUTS, "x"))
    assert cfg.mode == "single"


def test_every_mnp_name_a_plan_sets_is_known():
    from entrypoint.plan import make as plan
    from entrypoint.probe import facts

    cfg = config.load(dict(MAIN, MNP_SECRET="s"))
    node = facts.NodeFacts(binaries={"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd"},
                           is_root=True, interface="eth0", address="10.0.0.2")
    hostfiles = {"openmpi": "/run/mnp/hostfile", "plain": "/run/mnp/hostfile.plain",
                 "intel": "/run/mnp/hostfile.intel"}
    env = plan.make_plan(cfg, node, ["python3", "t.py"], {}, None, hostfiles).environment
    ours = {name for name in env if name.startswith(config.PREFIX)}
    assert ours and ours <= set(config.SETTINGS) | set(config.OUTPUTS), ours


@pytest.mark.parametrize("value,suggestion", [
    ("p5.48xlarg", "p5.48xlarge"), ("p4d.24xl", "p4d.24xlarge"), ("g6e.48xlarge ", None),
    ("g6.2xlarge", None),  # not in the table, but of a family it knows (test_ep_instance_family)
])
def test_a_misspelt_instance_type_is_an_error_with_a_suggestion(value, suggestion):
    if suggestion is None:  # surrounding blanks are stripped: a listed type is accepted
        assert config.load({"MNP_INSTANCE_TYPE": value}).instance_type == value.strip()
        return
    with pytest.raises(config.ConfigError) as info:
        config.load({"MNP_INSTANCE_TYPE": value})
    message = str(info.value)
    assert message.startswith("MNP_INSTANCE_TYPE:") and "is not an EC2 instance size" in message
    assert f"did you mean {suggestion}?" in message
