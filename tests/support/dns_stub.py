"""A tiny DNS server on 127.0.0.1 that answers one name with several A records.

For gRPC's `dns://127.0.0.1:PORT/NAME:PORT` targets (the c-ares resolver, gRPC's default,
honours the authority): the round-robin test needs a name that resolves to two loopback
addresses without touching /etc/hosts. A (IPv4) queries for the name get every address;
anything else gets an empty answer (AAAA) or NXDOMAIN (other names).
"""

from __future__ import annotations

import socket
import struct
import threading


def _read_name(packet: bytes, offset: int) -> tuple[str, int]:
    labels = []
    while packet[offset]:
        length = packet[offset]
        labels.append(packet[offset + 1 : offset + 1 + length].decode())
        offset += 1 + length
    return ".".join(labels).lower(), offset + 1


class DnsStub:
    def __init__(self, name: str, addresses: list[str]) -> None:
        self.name = name.lower().rstrip(".")
        self.addresses = addresses
        self.queries: list[tuple[str, int]] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                packet, peer = self.sock.recvfrom(512)
            except OSError:
                return
            try:
                self.sock.sendto(self._answer(packet), peer)
            except (OSError, IndexError, UnicodeDecodeError):
                continue

    def _answer(self, packet: bytes) -> bytes:
        (ident,) = struct.unpack("!H", packet[:2])
        name, end = _read_name(packet, 12)
        qtype, _qclass = struct.unpack("!HH", packet[end : end + 4])
        question = packet[12 : end + 4]
        self.queries.append((name, qtype))
        if name != self.name:
            return struct.pack("!HHHHHH", ident, 0x8183, 1, 0, 0, 0) + question  # NXDOMAIN
        answers = b""
        count = 0
        if qtype == 1:  # A
            for address in self.addresses:
                # Name as a pointer to the question (offset 12), type A, class IN, TTL 1 s.
                answers += struct.pack("!HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(address)
                count += 1
        return struct.pack("!HHHHHH", ident, 0x8180, 1, count, 0, 0) + question + answers

    def close(self) -> None:
        self.sock.close()
