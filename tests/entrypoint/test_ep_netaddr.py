"""Address choice: route lookup, exclusions, override."""

import pytest

from entrypoint.probe import netaddr

IFACES = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("ecs-eth0", "169.254.172.2"),
          ("eth0", "10.0.1.7"), ("veth12ab", "172.18.0.1")]


def route_to(addr):
    return lambda destination: addr


def test_route_lookup_towards_main_node():
    choice = netaddr.choose("10.0.1.5", interfaces=IFACES, route=route_to("10.0.1.7"))
    assert (choice.address, choice.interface) == ("10.0.1.7", "eth0")
    assert "10.0.1.5" in choice.reason


def test_main_node_uses_default_route():
    seen = []

    def route(destination):
        seen.append(destination)
        return "10.0.1.7"

    choice = netaddr.choose(None, interfaces=IFACES, route=route)
    assert choice.address == "10.0.1.7"
    assert seen == [netaddr.ROUTE_PROBE]


@pytest.mark.parametrize("bad", ["127.0.0.1", "169.254.172.2", "172.17.0.1", "172.18.0.1"])
def test_unusable_route_source_falls_back_to_a_usable_interface(bad):
    choice = netaddr.choose("10.0.1.5", interfaces=IFACES, route=route_to(bad))
    assert (choice.address, choice.interface) == ("10.0.1.7", "eth0")
    assert "not usable" in choice.reason


def test_route_failure_falls_back():
    def route(destination):
        raise OSError(101, "Network is unreachable")

    choice = netaddr.choose(None, interfaces=IFACES, route=route)
    assert choice.interface == "eth0"
    assert "unreachable" in choice.reason


def test_never_loopback_docker_veth_or_link_local():
    only_bad = [i for i in IFACES if i[0] != "eth0"]
    with pytest.raises(netaddr.AddressError) as info:
        netaddr.choose(None, interfaces=only_bad, route=route_to("127.0.0.1"))
    assert "docker0" in str(info.value)


def test_override_wins():
    ifaces = IFACES + [("ens6", "10.0.2.9")]
    choice = netaddr.choose("10.0.1.5", override="ens6", interfaces=ifaces,
                            route=route_to("10.0.1.7"))
    assert (choice.address, choice.interface) == ("10.0.2.9", "ens6")


def test_override_without_address_is_an_error():
    with pytest.raises(netaddr.AddressError, match="MNP_NETWORK_INTERFACE=ens9"):
        netaddr.choose(None, override="ens9", interfaces=IFACES, route=route_to("10.0.1.7"))
    with pytest.raises(netaddr.AddressError, match="not usable"):
        netaddr.choose(None, override="lo", interfaces=IFACES, route=route_to("10.0.1.7"))


def test_real_host_lookup_returns_something_sane():
    interfaces = netaddr.list_interfaces()
    assert ("lo", "127.0.0.1") in interfaces
    try:
        choice = netaddr.choose(None)
    except netaddr.AddressError:
        pytest.skip("no usable interface on this host")
    assert netaddr.address_usable(choice.address)
