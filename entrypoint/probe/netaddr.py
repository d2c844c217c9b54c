"""This node's address: the one it reaches the main node from.

Rules, in order:

1. ``MNP_NETWORK_INTERFACE`` set: that interface's IPv4 address (error if it has none).
2. Route lookup: a UDP socket ``connect()`` towards the main node's address (children) or towards a
   documentation address ``192.0.2.1`` (the main node, which has no address variable; this follows
   the default route). No packet is sent; the kernel picks the source address. The interface is
   the one holding that address.
3. If the route lookup fails or picks an unusable address, the first usable interface by name.

Unusable: loopback, ``docker0``, ``veth*``, link-local ``169.254.0.0/16`` (the ECS ``awsvpc``
bridge gives every task one, ``ecs-eth0``), unspecified or multicast addresses.

Everything takes its inputs as arguments (``interfaces``: list of ``(name, ipv4)``; ``route``: a
function from destination to source address) so it is tested without touching the host.
"""

import fcntl
import ipaddress
import socket
import struct

ROUTE_PROBE = "192.0.2.1"  # TEST-NET-1: routed by the default route, never answered
EXCLUDED_PREFIXES = ("lo", "docker", "veth", "virbr", "ecs-")
SIOCGIFADDR = 0x8915


class AddressError(Exception):
    """No usable address; the message says what was seen."""


def interface_usable(name):
    return not name.startswith(EXCLUDED_PREFIXES)


def address_usable(addr):
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def list_interfaces():
    """``[(name, ipv4)]`` for every interface with an IPv4 address (Linux ioctl, stdlib only)."""
    result = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return result
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for name in names:
            try:
                packed = struct.pack("256s", name.encode("utf-8")[:15])
                data = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, packed)
            except OSError:
                continue
            result.append((name, socket.inet_ntoa(data[20:24])))
    finally:
        probe.close()
    return result


def route_source(destination):
    """The source address the kernel would use to reach ``destination`` (no packet is sent)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect((destination, 9))
        return sock.getsockname()[0]
    finally:
        sock.close()


class Choice(object):
    """The chosen address and interface, with the reason in words."""

    def __init__(self, address, interface, reason):
        self.address = address
        self.interface = interface
        self.reason = reason

    def __repr__(self):
        return "Choice(%r, %r, %r)" % (self.address, self.interface, self.reason)


def choose(main_address=None, override=None, interfaces=None, route=None):
    """Pick this node's ``Choice``. Raises ``AddressError`` when nothing is usable."""
    if interfaces is None:
        interfaces = list_interfaces()
    if route is None:
        route = route_source
    seen = ", ".join("%s=%s" % pair for pair in interfaces) or "none"

    if override:
        for name, addr in interfaces:
            if name == override:
                if not address_usable(addr):
                    raise AddressError("MNP_NETWORK_INTERFACE=%s has only %s, which is not usable"
                                       % (override, addr))
                return Choice(addr, name, "MNP_NETWORK_INTERFACE=%s" % override)
        raise AddressError("MNP_NETWORK_INTERFACE=%s has no IPv4 address (interfaces: %s)"
                           % (override, seen))

    target = main_address or ROUTE_PROBE
    why = "route to the main node %s" % main_address if main_address else "default route"
    try:
        source = route(target)
    except OSError as exc:
        source = None
        why = "%s failed (%s)" % (why, exc)
    if source is not None:
        names = [name for name, addr in interfaces if addr == source]
        name = names[0] if names else None
        if address_usable(source) and (name is None or interface_usable(name)):
            return Choice(source, name, "%s via %s" % (why, name or "unknown interface"))
        why = "%s gave %s on %s, not usable" % (why, source, name)

    candidates = sorted((name, addr) for name, addr in interfaces
                        if interface_usable(name) and address_usable(addr))
    if candidates:
        name, addr = candidates[0]
        return Choice(addr, name, "%s; first usable interface" % why)
    raise AddressError("no usable IPv4 address (%s; interfaces: %s)" % (why, seen))
