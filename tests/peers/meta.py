# The kernel's side of tests/kernel_meta.rs, run in the peer namespace.
#
#   meta.py recv DEV PORT COUNT SECS
#     Binds UDP PORT on IPv4 and IPv6 (v6only), asks for every control
#     message Linux has for what spate sets (IP_RECVTOS, IP_RECVTTL,
#     IP_PKTINFO; IPV6_RECVTCLASS, IPV6_RECVHOPLIMIT, IPV6_RECVPKTINFO),
#     and captures DEV's frames with an AF_PACKET socket to see their
#     Ethernet destination. Prints one JSON line per datagram, until COUNT
#     came or SECS passed.
#
#   meta.py sniff DEV SECS
#     Prints one JSON line per frame DEV receives for SECS: its Ethernet
#     destination and type, an ARP request's target, an IPv4 UDP
#     datagram's last 16 payload bytes.
#
#   meta.py send DEV JOBS
#     Sends what JOBS (JSON) lists: [{"dst": "198.18.0.2", "port": 7000,
#     "tos": 138, "ttl": 33, "count": 3, "gap_ms": 5, "tag": "u4"}, ...].
#     A broadcast destination is sent with SO_BROADCAST, bound to DEV.
#     Prints one JSON line per datagram with CLOCK_REALTIME nanoseconds
#     read just before its sendto.

import json
import select
import socket
import struct
import sys
import time

IP_PKTINFO = 8
IP_RECVTTL = 12
IP_RECVTOS = 13
IP_TTL = 2
IP_TOS = 1
IPV6_RECVPKTINFO = 49
IPV6_PKTINFO = 50
IPV6_RECVHOPLIMIT = 51
IPV6_HOPLIMIT = 52
IPV6_RECVTCLASS = 66
IPV6_TCLASS = 67
IPV6_UNICAST_HOPS = 16
SO_BINDTODEVICE = 25
ETH_P_ALL = 3


def out(**kw):
    print(json.dumps(kw), flush=True)


def recv(dev, port, count, secs):
    s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s4.bind(("0.0.0.0", port))
    for opt in (IP_RECVTOS, IP_RECVTTL, IP_PKTINFO):
        s4.setsockopt(socket.IPPROTO_IP, opt, 1)
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s6.bind(("::", port))
    for opt in (IPV6_RECVTCLASS, IPV6_RECVHOPLIMIT, IPV6_RECVPKTINFO):
        s6.setsockopt(socket.IPPROTO_IPV6, opt, 1)
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    raw.bind((dev, 0))
    macs = {}
    out(ready=True)
    got = 0
    deadline = time.time() + secs
    while got < count and time.time() < deadline:
        ready, _, _ = select.select([s4, s6, raw], [], [], 0.2)
        for s in ready:
            if s is raw:
                frame, addr = raw.recvfrom(65535)
                # Outgoing frames of this side are not spate's.
                if addr[2] == socket.PACKET_OUTGOING:
                    continue
                macs[frame[-16:]] = frame[0:6].hex(":")
                continue
            data, anc, _, src = s.recvmsg(65535, 1024)
            rec = {"fam": 4 if s is s4 else 6, "src": src[0], "sport": src[1], "payload": data.decode()}
            for level, kind, body in anc:
                if level == socket.IPPROTO_IP and kind == IP_TOS:
                    rec["tos"] = body[0]
                elif level == socket.IPPROTO_IP and kind == IP_TTL:
                    rec["ttl"] = struct.unpack("i", body[:4])[0]
                elif level == socket.IPPROTO_IP and kind == IP_PKTINFO:
                    rec["dst"] = socket.inet_ntop(socket.AF_INET, body[8:12])
                elif level == socket.IPPROTO_IPV6 and kind == IPV6_TCLASS:
                    rec["tos"] = struct.unpack("i", body[:4])[0]
                elif level == socket.IPPROTO_IPV6 and kind == IPV6_HOPLIMIT:
                    rec["ttl"] = struct.unpack("i", body[:4])[0]
                elif level == socket.IPPROTO_IPV6 and kind == IPV6_PKTINFO:
                    rec["dst"] = socket.inet_ntop(socket.AF_INET6, body[:16])
            # The frame came in before its datagram: its tail is the payload's.
            for _ in range(50):
                mac = macs.get(data[-16:])
                if mac or len(data) < 16:
                    break
                r, _, _ = select.select([raw], [], [], 0.01)
                if r:
                    frame, addr = raw.recvfrom(65535)
                    if addr[2] != socket.PACKET_OUTGOING:
                        macs[frame[-16:]] = frame[0:6].hex(":")
            rec["mac"] = macs.get(data[-16:])
            out(**rec)
            got += 1
    out(done=got)


def send(dev, jobs):
    for job in json.loads(jobs):
        v6 = ":" in job["dst"]
        s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
        if v6:
            s.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, job.get("tos", 0))
            s.setsockopt(socket.IPPROTO_IPV6, IPV6_UNICAST_HOPS, job.get("ttl", 64))
        else:
            s.setsockopt(socket.IPPROTO_IP, IP_TOS, job.get("tos", 0))
            s.setsockopt(socket.IPPROTO_IP, IP_TTL, job.get("ttl", 64))
        if job.get("broadcast"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, dev.encode())
        for i in range(job.get("count", 1)):
            # Unique in its last 16 bytes, where the receiver matches frames.
            payload = "kernel datagram " + ("%s-%04d" % (job["tag"], i)).rjust(16, ".")
            t = time.time_ns()
            s.sendto(payload.encode(), (job["dst"], job["port"]))
            out(sent=payload, ns=t)
            time.sleep(job.get("gap_ms", 2) / 1000)
        s.close()
    out(done=True)


def sniff(dev, secs):
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    raw.bind((dev, 0))
    out(ready=True)
    deadline = time.time() + secs
    while time.time() < deadline:
        r, _, _ = select.select([raw], [], [], 0.1)
        if not r:
            continue
        frame, addr = raw.recvfrom(65535)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        kind = struct.unpack("!H", frame[12:14])[0]
        rec = {"dst": frame[0:6].hex(":"), "type": kind}
        if kind == 0x0806 and frame[20:22] == b"\x00\x01":
            rec["arp_target"] = socket.inet_ntop(socket.AF_INET, frame[38:42])
        if kind == 0x0800 and frame[23] == 17:
            rec["tail"] = frame[-16:].decode(errors="replace")
            rec["tos"] = frame[15]
        out(**rec)
    out(done=True)


# Under `python3 -c`, the arguments follow in sys.argv[1:].
if sys.argv[1] == "recv":
    recv(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
elif sys.argv[1] == "sniff":
    sniff(sys.argv[2], float(sys.argv[3]))
else:
    send(sys.argv[2], sys.argv[3])
