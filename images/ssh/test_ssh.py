"""OpenSSH layer: client and server present, no host key baked into the image, and an sshd that
makes the container's own host keys when it starts with the system configuration (the MPI
operator's default worker command, ``/usr/sbin/sshd -De``)."""

# A port nothing else in the test container uses; sshd writes its PidFile (/run/sshd.pid) even
# with -D, which stops it afterwards.
PORT = 2022


def test_sshd_and_client_run(host):
    assert host.run("/usr/sbin/sshd -V 2>&1 || true").stdout.startswith("OpenSSH") or \
        "OpenSSH" in host.run("ssh -V 2>&1").stdout
    assert host.exists("ssh")
    assert host.file("/run/sshd").is_directory


def test_no_host_keys_in_image(host):
    keys = host.run("ls /etc/ssh/ssh_host_* 2>/dev/null").stdout.split()
    assert keys == [], f"host keys baked into the image: {keys}"


def test_sshd_config_is_valid_with_a_runtime_key(host):
    # The entrypoint generates host keys per job; prove sshd accepts its config with one, and
    # that a caller with its own key leaves /etc/ssh without keys.
    out = host.run("ssh-keygen -q -N '' -t ed25519 -f /tmp/hk && /usr/sbin/sshd -t -h /tmp/hk"
                   " && echo ok; rm -f /tmp/hk /tmp/hk.pub")
    assert out.rc == 0 and "ok" in out.stdout, out.stderr
    assert host.run("ls /etc/ssh/ssh_host_* 2>/dev/null").stdout == ""


def test_the_real_sshd_is_diverted_and_the_wrapper_runs_it(host):
    diversion = host.run("dpkg-divert --list /usr/sbin/sshd").stdout
    assert "diversion of /usr/sbin/sshd to /usr/sbin/sshd.real" in diversion, diversion
    assert host.file("/usr/sbin/sshd.real").mode & 0o111
    assert host.file("/usr/sbin/sshd").content_string.startswith("#!/bin/sh")


def test_the_system_sshd_allows_keys_in_a_world_writable_secret_volume(host):
    # StrictModes no: the operator's Secret volume at /root/.ssh is a world-writable directory
    out = host.run("ssh-keygen -q -N '' -t ed25519 -f /tmp/hk && /usr/sbin/sshd -T -h /tmp/hk;"
                   " rm -f /tmp/hk /tmp/hk.pub")
    assert "strictmodes no" in out.stdout.splitlines(), out.stdout + out.stderr


def test_the_operators_default_command_makes_host_keys_and_serves(host):
    # Waits for sshd's PidFile, which it writes once its sockets are bound (sshd.c, "Write out
    # the pid file after the sigterm handler is setup and the listen sockets are bound"), with
    # the shell's own test: under qemu every program started costs a process's emulated start,
    # and a scan-and-grep each tenth of a second competed with the key generation it waited for.
    start = (f"rm -f /run/sshd.pid; /usr/sbin/sshd -De -p {PORT} 2>/tmp/sshd.log & "
             "for i in $(seq 240); do [ -s /run/sshd.pid ] && break; sleep 0.25; done; "
             f"ssh-keyscan -t ed25519 -p {PORT} 127.0.0.1 2>/dev/null; "
             "ls /etc/ssh/ssh_host_*_key; kill \"$(cat /run/sshd.pid)\"; cat /tmp/sshd.log")
    try:
        out = host.run(start)
        assert "ssh-ed25519" in out.stdout, out.stdout + out.stderr
        assert "generating new host keys" in out.stdout, out.stdout
        for kind in ("rsa", "ecdsa", "ed25519"):
            assert f"/etc/ssh/ssh_host_{kind}_key" in out.stdout.split(), out.stdout
    finally:  # the container is shared with the layer's other tests
        host.run("rm -f /etc/ssh/ssh_host_* /run/sshd.pid /tmp/sshd.log")
