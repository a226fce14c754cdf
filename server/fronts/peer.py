"""Which local user is at the other end of a TCP connection, read from the kernel's socket tables.

System shared memory is a local-host feature: a client names a ``/dev/shm`` file and the server maps
it. The fronts (``server.fronts.http_front``, ``server.fronts.grpc_front``) let a client name only
files it owns, so they need the client's uid. For a loopback connection the client's own socket is listed in
``/proc/net/tcp`` or ``tcp6`` (an IPv4 address on a dual-stack socket appears there as
``::ffff:a.b.c.d``) with the uid that opened it: its local address is our peer's address and its
remote address is our end. A peer on another host (or in another network namespace) has no such
entry, and gets ``None``: it cannot share memory with this host anyway.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _words(packed: bytes) -> str:
    """An address as the kernel prints it: 32-bit words in host byte order, in hex."""
    return "".join(
        f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4)
    )


def _spellings(host: str) -> set[str]:
    """Every way the tables may print ``host``: as IPv4 and as IPv4-mapped IPv6, or as IPv6."""
    address = ipaddress.ip_address(host.strip("[]"))
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.version == 4:
        return {_words(address.packed), _words(ipaddress.IPv6Address(f"::ffff:{address}").packed)}
    return {_words(address.packed)}


def peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the client socket ``peer`` connected to our ``local`` (host, port); None when
    the peer's socket is not on this host (or the tables cannot be read). A ``local`` host of
    ``0.0.0.0`` or ``::`` (listening on every interface) matches our port on any address."""
    try:
        peers = {f"{spelling}:{peer[1]:04X}" for spelling in _spellings(peer[0])}
        any_address = ipaddress.ip_address(local[0].strip("[]")).is_unspecified
        ours = set() if any_address else {f"{spelling}:{local[1]:04X}" for spelling in _spellings(local[0])}
    except ValueError:
        return None
    port = f":{local[1]:04X}"
    for table in TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 7
                and fields[1] in peers
                and (fields[2] in ours or (any_address and fields[2].endswith(port)))
            ):
                return int(fields[7])
    return None
