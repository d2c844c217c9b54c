"""libfabric layer: fi_info reports the matrix version and the tcp provider works."""


def test_version_matches_matrix(host, layer):
    out = host.check_output("fi_info --version")
    assert f"libfabric: {layer['version']}" in out


def test_tcp_provider_available(host):
    out = host.run("fi_info -p tcp")
    assert out.rc == 0 and "provider: tcp" in out.stdout, out.stdout + out.stderr


def test_apt_lists_cleaned(host):
    assert host.check_output("find /var/lib/apt/lists -type f -name '*_Packages*' | wc -l") == "0"
