"""The ferry tcp link protocol from the outside, in raw bytes (docs/wire-format.md section 3):
link frames, the HMAC handshake and control envelopes. Written from the document, not from the
C++ sources, so that a mismatch between them shows."""
import hashlib
import hmac
import os
import socket
import struct

import msgpack

HELLO, CHALLENGE, PROOF, ACCEPT, REFUSE = 1, 2, 3, 4, 5
CONTROL, WRITE, WRITE_ACK = 16, 17, 18
MAGIC = b"FRYL"
LINK_VERSION = 1
AUTH_NONE, AUTH_HMAC = 0, 1

# transport_errc values a REFUSE or WRITE_ACK may carry.
UNKNOWN_REGION, KEY_MISMATCH, OUT_OF_BOUNDS = 1, 2, 3
PEER_UNREACHABLE, UNAUTHENTICATED, LIMIT_EXCEEDED = 5, 10, 11


class Closed(Exception):
    """The server closed (or reset) the connection."""


def link_frame(frame_type, body=b""):
    return struct.pack(">IB", 1 + len(body), frame_type) + body


def proof(secret, role, nonce_c, nonce_s, id_c, id_s):
    label = b"ferry-link-1 " + role.encode()
    return hmac.new(secret, label + nonce_c + nonce_s + struct.pack(">II", id_c, id_s), hashlib.sha256).digest()


PROTOCOL = 3  # runtime/message.hpp protocol_version


def envelope(kind, body, sender=(900, 1), to=(0, 1), protocol=PROTOCOL, epoch=0):
    """One msgpack envelope (no length prefix): [protocol, kind, from, to, epoch, body]."""
    return msgpack.packb([protocol, kind, list(sender), list(to), epoch, body], use_bin_type=True)


def write_header(region, key, offset, length, imm, write_id):
    return struct.pack(">QQQQIQ", region, key, offset, length, imm, write_id)


class Link:
    """One client connection to a ferry node."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self):
        self.sock.close()

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed(str(e)) from e

    def read_exact(self, n):
        chunks = []
        while n:
            try:
                chunk = self.sock.recv(n)
            except ConnectionResetError as e:
                raise Closed(str(e)) from e
            if not chunk:
                raise Closed("end of stream")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def read_frame(self):
        length, frame_type = struct.unpack(">IB", self.read_exact(5))
        return frame_type, self.read_exact(length - 1)

    def closed_by_peer(self, timeout=10.0):
        """True once the server closes the connection (after whatever it still sends)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(4096):
                    return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def hello(self, mode, me, them, nonce):
        self.send(link_frame(HELLO, MAGIC + struct.pack(">HBII", LINK_VERSION, mode, me, them) + nonce))

    def handshake(self, secret, me, them):
        """Runs the client side; returns ("accept", None) or ("refuse", reason) or ("bad-server-proof", None)."""
        nonce_c = os.urandom(32)
        self.hello(AUTH_HMAC if secret is not None else AUTH_NONE, me, them, nonce_c)
        frame_type, body = self.read_frame()
        if frame_type == REFUSE:
            return "refuse", struct.unpack(">H", body)[0]
        assert frame_type == CHALLENGE and len(body) == 75, (frame_type, len(body))
        assert body[:4] == MAGIC
        server_id = struct.unpack(">I", body[7:11])[0]
        nonce_s, proof_s = body[11:43], body[43:75]
        key = secret if secret is not None else b""
        server_ok = hmac.compare_digest(proof_s, proof(key, "server", nonce_c, nonce_s, me, server_id))
        # Sends the proof even when the server's is wrong for us: the server must judge ours.
        mine = proof(key, "client", nonce_c, nonce_s, me, server_id) if secret is not None else bytes(32)
        self.send(link_frame(PROOF, mine))
        frame_type, body = self.read_frame()
        if frame_type == REFUSE:
            return "refuse", struct.unpack(">H", body)[0]
        assert frame_type == ACCEPT and body == b"", (frame_type, body)
        return ("accept" if server_ok else "bad-server-proof"), None

    def control(self, payload):
        self.send(link_frame(CONTROL, payload))

    def write(self, header, payload):
        self.send(link_frame(WRITE, header) + payload)

    def read_ack(self):
        frame_type, body = self.read_frame()
        assert frame_type == WRITE_ACK and len(body) == 10, (frame_type, body)
        return struct.unpack(">QH", body)
