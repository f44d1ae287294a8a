#!/usr/bin/python3
"""A real multi-process ferry job over authenticated tcp, and hostile clients on its coordinator.

Before the job's nodes start, clients (a) without the secret, (b) with a wrong secret, or naming
another node, sending garbage or a frame before the handshake are refused, and the coordinator's
limits on handshakes in progress and on links per node hold. While the job runs, clients that do
hold the secret send hand-made hostile frames, round after round: wrong types, depth bombs, huge
inner lengths, unknown kinds, wrong protocol, truncated and trailing bytes, a forged sender,
frames for other nodes and actors, a bulk write into an unregistered region (each rejected, the
link kept), and huge length prefixes, empty frames, unknown frame types, acks towards the server,
bad write headers, cut frames (each dropping the link). Asserted: every refusal and drop as seen
on the wire, the coordinator's log counting every rejection by reason, and the legitimate job
completing every version with verified digests.

Usage: hostile_job.py FERRY_BINARY
"""
import atexit
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ferry_wire as w  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from job_verdict import check, failures  # noqa: E402

VERSIONS = 8
JOB = ["--trainers", "1", "--instances", "1", "--workers", "2", "--model-bytes", "32MiB",
       "--chunk-bytes", "1MiB", "--versions", str(VERSIONS), "--transport", "tcp", "--timeout", "120"]
# Sanitizer builds on a loaded 2-core machine can keep a node's loop busy past the default 2 s of
# silence; this test is about hostile peers, not failure detection.
COORDINATOR_ONLY = ["--heartbeat-timeout", "30"]
COORDINATOR = 0


def expect_refused(link, secret, me, them, reason, what):
    try:
        outcome = link.handshake(secret, me, them)
    except w.Closed as e:
        return check(False, f"{what}: closed without a REFUSE ({e})")
    check(outcome == ("refuse", reason), f"{what}: expected REFUSE({reason}), got {outcome}")
    check(link.closed_by_peer(), f"{what}: the connection stayed open after REFUSE")


def expect_dropped(link, data, what):
    try:
        link.send(data)
    except w.Closed:
        return
    check(link.closed_by_peer(), f"{what}: the server kept the connection")


def pre_job_attacks(host, port, secret):
    """Attacks while the coordinator waits for its job to register."""
    wrong = bytes(b ^ 0x5A for b in secret)
    expect_refused(w.Link(host, port), None, 901, COORDINATOR, w.UNAUTHENTICATED, "(a) no secret")
    expect_refused(w.Link(host, port), wrong, 902, COORDINATOR, w.UNAUTHENTICATED, "(b) wrong secret")
    expect_refused(w.Link(host, port), secret, 903, 7, w.PEER_UNREACHABLE, "HELLO for another node")
    expect_dropped(w.Link(host, port), b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n", "HTTP before the handshake")
    expect_dropped(w.Link(host, port), w.link_frame(w.CONTROL, w.envelope(1, {"nonce": 1, "payload": ""})),
                   "CONTROL before the handshake")

    # Connections of one address in their handshake are capped (max_unauthenticated_per_address,
    # 8 by default, well below max_unauthenticated, 32): each idle connection past the cap closes
    # the address's oldest idle one, which gets REFUSE(limit_exceeded) and a close; the newest 8
    # stay open.
    idle = [w.Link(host, port) for _ in range(40)]
    time.sleep(0.5)  # the coordinator takes them in
    refused, still_open = 0, 0
    for i, link in enumerate(idle):
        oldest = i < 32
        link.sock.settimeout(5 if oldest else 0.2)
        try:
            frame_type, body = link.read_frame()
            got_refuse = frame_type == w.REFUSE and struct.unpack(">H", body)[0] == w.LIMIT_EXCEEDED
            refused += oldest and got_refuse and link.closed_by_peer()
        except socket.timeout:
            still_open += not oldest
        except w.Closed:
            pass
    check(refused == 32, f"max_unauthenticated_per_address: {refused} of the 32 oldest idle connections closed "
                         "with REFUSE(limit_exceeded)")
    check(still_open == 8, f"max_unauthenticated_per_address: {still_open} of the 8 newest idle connections open")
    for link in idle:
        link.close()
    time.sleep(0.5)  # the coordinator notices the closes

    # Links per authenticated node id are capped (max_links_per_node, 4 by default).
    held = []
    for i in range(4):
        link = w.Link(host, port)
        check(link.handshake(secret, 950, COORDINATOR) == ("accept", None), f"link {i + 1} of node 950 accepted")
        held.append(link)
    expect_refused(w.Link(host, port), secret, 950, COORDINATOR, w.LIMIT_EXCEEDED, "a fifth link of node 950")
    for link in held:
        link.close()


def nested(depth, me):
    """An envelope whose body is `depth` arrays, one inside the other (msgpack 0x91 each)."""
    head = w.msgpack.packb([w.PROTOCOL, 1, [me, 1], [0, 1], 0, 0])[:-1]  # the 6-array without its body
    return head + b"\x91" * depth + b"\x00"


MALFORMED = "malformed frame: not a ferry envelope"


# Bad envelopes a node must reject and count while keeping the link: (reason in the log, payload).
def bad_envelopes(me):
    ping = {"nonce": 1, "payload": "x"}
    good = w.envelope(1, ping, sender=(me, 1))
    return [
        (MALFORMED, w.msgpack.packb(["one", 1, [me, 1], [0, 1], 0, ping])),
        (MALFORMED, w.msgpack.packb([w.PROTOCOL, -1, [me, 1], [0, 1], 0, ping])),
        (MALFORMED, w.msgpack.packb([w.PROTOCOL, 70000, [me, 1], [0, 1], 0, ping])),
        (MALFORMED, nested(5000, me)),
        (MALFORMED, b"\xdd\xff\xff\xff\xff" + b"\x00" * 16),  # array of 2^32-1 elements
        # A str announcing 2 GiB: msgpack-c waits for its bytes before it checks the size cap.
        ("truncated frame", b"\xdb\x7f\xff\xff\xff" + b"x" * 16),
        (MALFORMED, good + b"\x00"),  # trailing bytes
        (MALFORMED, b"\xc1"),  # never-used msgpack byte
        ("message body does not match its kind", w.envelope(1, [1, 2], sender=(me, 1))),
        ("message body does not match its kind", w.envelope(1, {"nonce": "x", "payload": 1}, sender=(me, 1))),
        ("message body does not match its kind", w.envelope(16, {"tensors": 5}, sender=(me, 1))),
        ("unknown message kind", w.envelope(9999, ping, sender=(me, 1))),
        ("wrong protocol version", w.envelope(1, ping, sender=(me, 1), protocol=1)),
        ("truncated frame", good[:-3]),
        ("envelope sender does not match the link it came on", w.envelope(1, ping, sender=(1, 1))),
        ("no route to that node", w.envelope(1, ping, sender=(me, 1), to=(5, 1))),
        ("no such actor on this node", w.envelope(1, ping, sender=(me, 1), to=(0, 77))),
    ]


def job_round(host, port, secret, me):
    """One round of hostile frames from authenticated node ids me..me+6; returns the rejections
    the coordinator must have logged."""
    link = w.Link(host, port)
    if not check(link.handshake(secret, me, COORDINATOR) == ("accept", None), f"node {me} accepted"):
        return {}
    expected = {}
    for reason, payload in bad_envelopes(me):
        link.control(payload)
        expected[reason] = expected.get(reason, 0) + 1
    # Bulk writes into regions the coordinator never registered: refused with an ack, link kept.
    link.write(w.write_header(0xDEAD, 0, 0, 4096, 0x01000000, 1), b"\xAB" * 4096)
    link.write(w.write_header(0, 0, 2**63, 16, 0, 2), b"\xCD" * 16)
    # The acks also prove that the link survived every rejection above (frames are in order).
    check(link.read_ack() == (1, w.UNKNOWN_REGION), "write into an unregistered region refused (1)")
    check(link.read_ack() == (2, w.UNKNOWN_REGION), "write far out of any region refused (2)")
    link.close()

    violations = [
        ("huge length prefix", struct.pack(">IB", 0xFFFFFFFF, w.CONTROL) + b"\x00" * 64),
        ("length just over max_frame_bytes", struct.pack(">IB", (16 << 20) + 2, w.CONTROL)),
        ("empty frame", struct.pack(">IB", 0, w.CONTROL)),
        ("unknown frame type", w.link_frame(99, b"\x00" * 8)),
        ("WRITE_ACK towards the server", w.link_frame(w.WRITE_ACK, b"\x00" * 10)),
        ("WRITE header of 10 bytes", w.link_frame(w.WRITE, b"\x00" * 10)),
        ("HELLO after the handshake", w.link_frame(w.HELLO, b"\x00" * 47)),
    ]
    for i, (what, data) in enumerate(violations):
        link = w.Link(host, port)
        if check(link.handshake(secret, me + 1 + i, COORDINATOR) == ("accept", None), f"node {me + 1 + i} accepted"):
            expect_dropped(link, data, what)
        link.close()
    # A frame cut short: the server waits for the rest, then sees the end of the stream.
    link = w.Link(host, port)
    if check(link.handshake(secret, me + 9, COORDINATOR) == ("accept", None), f"node {me + 9} accepted"):
        link.send(struct.pack(">IB", 1000, w.CONTROL) + b"\x97\x01")
        link.sock.shutdown(socket.SHUT_WR)
        check(link.closed_by_peer(), "cut frame: connection closed")
    link.close()
    return expected


def turned_away_by_reason(log):
    """The connections a node's summaries ("tcp N: turned away ...") count, by reason."""
    counts = {}
    for line in log.splitlines():
        one = re.search(r"turned away a connection from \S+ before its handshake: (.*)$", line)
        if one:
            counts[one.group(1)] = counts.get(one.group(1), 0) + 1
            continue
        many = re.search(r"turned away \d+ connections before their handshake in [\d.]+ s: (.*)$", line)
        for entry in many.group(1).split("; ") if many else []:
            m = re.match(r"(\d+) from \S+ \((.*)\)$", entry)
            if m:
                counts[m.group(2)] = counts.get(m.group(2), 0) + int(m.group(1))
    return counts


def main():
    ferry = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="ferry-hostile-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the logs are printed on failure
    # Hex text: ferry drops a secret file's final line end, so raw bytes ending in one would make
    # this client's proofs differ from the nodes'.
    secret = os.urandom(32).hex().encode()
    secret_file = os.path.join(work, "secret")
    with open(secret_file, "wb") as f:
        f.write(secret)
    os.chmod(secret_file, 0o600)
    env = dict(os.environ, FERRY_SECRET_FILE=secret_file, FERRY_LOG="info")
    env.pop("FERRY_SECRET", None)
    address_file = os.path.join(work, "coordinator")
    logs = {name: open(os.path.join(work, name + ".log"), "w+") for name in ["coordinator", "trainer", "w0", "w1"]}

    coordinator = subprocess.Popen([ferry, "coordinator", *JOB, *COORDINATOR_ONLY, "--address-file", address_file, "--json"],
                                   env=env, stdout=subprocess.PIPE, stderr=logs["coordinator"], text=True)
    nodes = []
    try:
        deadline = time.time() + 30
        while not os.path.exists(address_file) and time.time() < deadline and coordinator.poll() is None:
            time.sleep(0.02)
        with open(address_file) as f:
            address = f.read().strip()
        host, port = address.rsplit(":", 1)
        port = int(port)

        pre_job_attacks(host, port, secret)

        roles = [("trainer", ["--role", "trainer", "--shard", "0"]),
                 ("w0", ["--role", "worker", "--instance", "0", "--rank", "0"]),
                 ("w1", ["--role", "worker", "--instance", "0", "--rank", "1"])]
        for node_id, (name, role) in enumerate(roles, start=1):
            nodes.append(subprocess.Popen([ferry, "node", *JOB, "--coordinator", address, "--node-id", str(node_id),
                                           *role], env=env, stdout=subprocess.DEVNULL, stderr=logs[name]))

        # Hostile rounds for as long as the job runs (the first one must finish while it does).
        expected, rounds, me = {}, 0, 1000
        while coordinator.poll() is None:
            try:
                got = job_round(host, port, secret, me)
            except (w.Closed, ConnectionError, OSError) as e:
                # The job may just have ended: the coordinator closes its links before it exits.
                try:
                    coordinator.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    check(False, f"round {rounds + 1} failed while the coordinator runs on: {e!r}")
                break
            if coordinator.poll() is not None:
                break  # the coordinator may have stopped logging before this round ended
            rounds += 1
            me += 10
            time.sleep(0.2)  # a round every ~0.2 s keeps the coordinator's log readable
            for reason, n in got.items():
                expected[reason] = expected.get(reason, 0) + n
        check(rounds >= 1, "at least one hostile round completed while the job ran")

        stdout, _ = coordinator.communicate(timeout=150)
        codes = [n.wait(timeout=60) for n in nodes]
    finally:
        for p in [coordinator, *nodes]:
            if p.poll() is None:
                p.kill()
                p.wait()

    logs["coordinator"].seek(0)
    log = logs["coordinator"].read()
    try:
        verdict = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        verdict = {}
    check(coordinator.returncode == 0, f"coordinator exit code {coordinator.returncode}")
    check(codes == [0, 0, 0], f"node exit codes {codes}")
    check(verdict.get("verified") is True, f"job verified: {verdict.get('error', verdict)}")
    check(verdict.get("versions") == VERSIONS, f"versions {verdict.get('versions')} != {VERSIONS}")
    check(all(v.get("verified") for v in verdict.get("per_version", [])) and
          len(verdict.get("per_version", [])) == VERSIONS, "every version verified")

    rejected = re.findall(r"node 0: rejected a frame from node (\d+): (.*)", log)
    check(not [r for r in rejected if int(r[0]) < 900], "no frame of the legitimate nodes was rejected")
    for reason, n in expected.items():
        seen = sum(1 for node, why in rejected if int(node) >= 1000 and why == reason)
        check(seen >= n, f"coordinator logged {seen} rejections '{reason}', expected at least {n}")
    refused_writes = len(re.findall(r"tcp 0: refused a write of \d+ bytes from node \d+", log))
    check(refused_writes >= 2 * rounds, f"coordinator logged {refused_writes} refused writes for {rounds} rounds")
    # Connections that failed before their handshake are summed up (at most a line a second), by reason.
    turned_away = turned_away_by_reason(log)
    for reason, n in [("closed while idle to make room (max_unauthenticated_per_address)", 32),
                      ("peer not authenticated: authentication modes differ", 1),
                      ("peer not authenticated: wrong proof: the peer does not hold the job secret", 1),
                      ("peer unreachable: HELLO is for node 7", 1),
                      ("peer violated the link protocol: oversize or empty handshake frame", 1),  # HTTP
                      ("peer violated the link protocol: expected HELLO", 1),  # CONTROL first
                      ("node 950 already has 4 links (max_links_per_node)", 1)]:
        check(turned_away.get(reason, 0) >= n,
              f"coordinator counted {turned_away.get(reason, 0)} connections turned away for '{reason}', expected {n}")
    summaries = len(re.findall(r"tcp 0: turned away", log))
    dropped = len(re.findall(r"tcp 0: dropped .*", log))
    check(dropped >= 8 * rounds, f"coordinator logged {dropped} dropped links for {rounds} rounds")

    print(f"hostile rounds during the job: {rounds}; rejections logged: {len(rejected)}; "
          f"refused writes: {refused_writes}; dropped links: {dropped}; connections turned away before their "
          f"handshake: {sum(turned_away.values())} in {summaries} lines; job: {verdict.get('versions')} versions, "
          f"verified {verdict.get('verified')}")
    if failures:
        print(f"{len(failures)} checks FAILED; coordinator log tail:\n" + log[-5000:])
        for name in ["trainer", "w0", "w1"]:
            logs[name].seek(0)
            print(f"--- {name} log tail ---\n" + logs[name].read()[-2000:])
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
