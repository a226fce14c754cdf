"""Which local user is at the other end of a TCP connection: system shared memory lets a client name
only files it owns. A loopback client's socket is in the kernel's tables with its uid; one on another
host is not (``None``). Netlink socket diagnostics are asked first (well under a millisecond), the
``/proc/net/tcp*`` tables (17 ms on a busy machine) where netlink is refused.
"""

from __future__ import annotations

import array
import ipaddress
import socket
import struct
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLMSG_ERROR, NLM_F_REQUEST = 4, 20, 2, 1
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: match by addresses and ports alone
UID_AT = 16 + 64  # netlink header, then inet_diag_msg up to idiag_uid


def _words(packed: bytes) -> str:
    """An address as the kernel prints it: 32-bit words in host byte order, in hex."""
    return "".join(f"{word:08X}" for word in array.array("I", packed))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``host`` as an address, an IPv4-mapped IPv6 one as IPv4 (a dual-stack socket's IPv4 client)."""
    address = ipaddress.ip_address(host.strip("[]"))
    return address.ipv4_mapped or address if address.version == 6 else address


def _spellings(host: str) -> set[str]:
    """Every way the tables may print ``host``: as IPv4 and as IPv4-mapped IPv6, or as IPv6."""
    address = _address(host)
    if address.version == 4:
        return {_words(address.packed), _words(ipaddress.IPv6Address(f"::ffff:{address}").packed)}
    return {_words(address.packed)}


def _diag_uid(peer: tuple[str, int], local: tuple[str, int]) -> tuple[bool, int | None]:
    """(answered, uid or None) of the socket from ``peer`` to ``local``, asked of netlink."""
    address, ours = _address(peer[0]), _address(local[0])
    if address.version != ours.version:
        return False, None
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    socket_id = (
        struct.pack(">HH", peer[1], local[1])
        + address.packed.ljust(16, b"\0")
        + ours.packed.ljust(16, b"\0")
        + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)
    )
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + socket_id
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            diag.sendto(header + request, (0, 0))
            answer = diag.recv(4096)
    except OSError:
        return False, None
    if struct.unpack_from("=H", answer, 4)[0] == NLMSG_ERROR or len(answer) < UID_AT + 4:
        return True, None
    return True, struct.unpack_from("=I", answer, UID_AT)[0]


def peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the client socket ``peer`` connected to our ``local``; None: not this host."""
    try:
        answered, uid = _diag_uid(peer, local)
        if answered:
            return uid
        peers = {f"{spelling}:{peer[1]:04X}" for spelling in _spellings(peer[0])}
        ours = {f"{spelling}:{local[1]:04X}" for spelling in _spellings(local[0])}
    except ValueError:
        return None
    for table in TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for fields in map(str.split, lines):
            if len(fields) > 7 and fields[1] in peers and fields[2] in ours:
                return int(fields[7])
    return None
