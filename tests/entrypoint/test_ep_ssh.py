"""Per-job SSH material: keys, sshd and client configs, known_hosts."""

import os
import pwd
import shutil
import subprocess

import pytest

from entrypoint.probe import facts
from entrypoint.rendezvous.server import HOST_KEY_RE, NodeInfo
from entrypoint.run import ssh

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


def test_sshd_config_is_keys_only(tmp_path):
    paths = ssh.Paths(str(tmp_path))
    text = ssh.sshd_config_text(paths, 2222, "root")
    for line in ("Port 2222", "PasswordAuthentication no", "PubkeyAuthentication yes",
                 "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
                 "AllowUsers root", "UsePAM no", "AuthorizedKeysFile " + paths.authorized_keys,
                 "HostKey " + paths.host_key):
        assert line in text.splitlines()
    assert "PermitRootLogin no" in ssh.sshd_config_text(paths, 2222, "alice")


def test_client_config_checks_host_keys(tmp_path):
    paths = ssh.Paths(str(tmp_path))
    text = ssh.client_config_text(paths, 2222, "root", ["10.0.0.10"])
    assert "    StrictHostKeyChecking yes" in text.splitlines()
    assert "    ConnectionAttempts 10" in text.splitlines()
    assert f"    UserKnownHostsFile {paths.known_hosts}" in text.splitlines()
    assert "    Port 2222" in text.splitlines()
    assert "    BatchMode yes" in text.splitlines()
    assert "no" not in [line.split()[-1] for line in text.splitlines()
                        if "StrictHostKeyChecking" in line]


def test_known_hosts_lines():
    nodes = [NodeInfo(1, "10.0.0.11", 1, "ssh-ed25519 BBBB"),
             NodeInfo(0, "10.0.0.10", 1, "ssh-ed25519 AAAA"), NodeInfo(2, "10.0.0.12", 1, "")]
    assert ssh.known_hosts_text(nodes, 2222) == (
        "[10.0.0.10]:2222 ssh-ed25519 AAAA\n[10.0.0.11]:2222 ssh-ed25519 BBBB\n")
    assert ssh.known_hosts_text(nodes[:1], 22) == "10.0.0.11 ssh-ed25519 BBBB\n"


@needs_keygen
def test_prepare_server_and_client(tmp_path):
    paths = ssh.Paths(str(tmp_path))
    host_pub = ssh.prepare_server(paths, 2222, "root", "test-host")
    client_pub = ssh.prepare_client(paths, 2222, "root", "test-client", "10.0.0.10")
    assert HOST_KEY_RE.match(host_pub) and HOST_KEY_RE.match(client_pub)
    assert host_pub != client_pub
    assert oct(os.stat(paths.dir).st_mode & 0o777) == "0o700"
    assert oct(os.stat(paths.client_key).st_mode & 0o777) == "0o600"
    ssh.authorize(paths, client_pub)
    with open(paths.authorized_keys) as handle:
        assert handle.read() == client_pub + "\n"
    # a fresh key each time: nothing is reused between jobs
    assert ssh.prepare_client(paths, 2222, "root", "again", "10.0.0.10") != client_pub


def test_install_user_config_keeps_existing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    paths = ssh.Paths(str(tmp_path / "state"))
    note = ssh.install_user_config(paths)
    assert "wrote" in note
    with open(str(tmp_path / ".ssh" / "config")) as handle:
        assert handle.read() == f"Include {paths.ssh_config}\n"
    assert "kept" in ssh.install_user_config(paths)


def test_wait_listening(tmp_path):
    pid_file = tmp_path / "sshd.pid"
    assert not ssh.wait_listening(str(pid_file), 2222, 0.3)
    pid_file.write_text("123\n")
    assert ssh.wait_listening(str(pid_file), 2222, 2)
    assert not ssh.wait_listening(str(tmp_path / "nope"), 2222, 5, alive=lambda: False)


needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")


def resolved(config, host):
    """What OpenSSH itself would use for ``host`` (``ssh -G``: no connection is made)."""
    out = subprocess.run(["ssh", "-G", "-F", config, host], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


@needs_ssh
def test_ssh_trust_is_scoped_to_the_job_nodes(tmp_path, monkeypatch):
    """Issue 12, Medium 6: the job's settings (port, known_hosts, strict checking) apply to the
    job's nodes only, also through ~/.ssh/config; ssh or git to any other host is untouched.
    The old ``Host *`` block sent github.com to port 2222 with the job's known_hosts."""
    monkeypatch.setenv("HOME", str(tmp_path))
    paths = ssh.Paths(str(tmp_path / "state"))
    paths.make()
    nodes = [NodeInfo(0, "10.0.0.10", 1, "ssh-ed25519 AAAA"),
             NodeInfo(1, "10.0.0.11", 1, "ssh-ed25519 BBBB")]
    ssh.write_known_hosts(paths, nodes, 2222, "root")
    ssh.install_user_config(paths)
    for config in (paths.ssh_config, str(tmp_path / ".ssh" / "config")):
        node = resolved(config, "10.0.0.11")
        assert node["port"] == "2222" and node["stricthostkeychecking"] == "true"
        assert paths.known_hosts in node["userknownhostsfile"]
        other = resolved(config, "github.com")
        assert other["port"] == "22"
        assert paths.known_hosts not in other["userknownhostsfile"]


def test_client_config_refuses_a_non_address():
    with pytest.raises(ssh.SshError):
        ssh.client_config_text(ssh.Paths("/x"), 22, "root", ["*"])


def test_ssh_user_is_the_real_uid_not_USER(monkeypatch):
    """Issue 12, Medium 7: root with USER=ubuntu must get AllowUsers root."""
    monkeypatch.setenv("USER", "ubuntu")
    monkeypatch.setenv("LOGNAME", "ubuntu")
    assert facts.current_user() == pwd.getpwuid(os.getuid()).pw_name
