"""HTTP/0.9 over QUIC (ALPN hq-interop) with aioquic, an independent QUIC
implementation, for spate's tests: its own H0Connection speaks the
protocol both ways.

  hq.py get HOST PORT OUTDIR CAFILE PATH...   fetch each PATH, save it in
      OUTDIR under its last part; print one JSON line per path
      ({"path", "bytes"} or {"path", "error"}) and {"done": ...}
  hq.py serve HOST PORT ROOT CERT KEY SECS     serve files under ROOT for
      SECS seconds (a missing file: the stream reset with 404)

CAFILE "-" takes any certificate.
"""

import asyncio
import json
import os
import ssl
import sys

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.h0.connection import H0_ALPN, H0Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h0 = H0Connection(self._quic)
        self.waiting = {}

    async def get(self, path):
        sid = self._quic.get_next_available_stream_id()
        self.h0.send_headers(sid, [(b":method", b"GET"), (b":path", path.encode())], end_stream=True)
        done = self._loop.create_future()
        self.waiting[sid] = (done, bytearray())
        self.transmit()
        return await asyncio.wait_for(done, 60)

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            done, _ = self.waiting.pop(event.stream_id)
            done.set_exception(RuntimeError(f"reset with code {event.error_code}"))
        elif isinstance(event, ConnectionTerminated):
            for done, _ in self.waiting.values():
                done.set_exception(RuntimeError(f"connection closed: {event.reason_phrase}"))
            self.waiting.clear()
        for e in self.h0.handle_event(event):
            if isinstance(e, DataReceived) and e.stream_id in self.waiting:
                done, buf = self.waiting[e.stream_id]
                buf += e.data
                if e.stream_ended:
                    del self.waiting[e.stream_id]
                    done.set_result(bytes(buf))


async def get(host, port, outdir, cafile, paths):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H0_ALPN)
    if cafile == "-":
        cfg.verify_mode = ssl.CERT_NONE
    else:
        cfg.load_verify_locations(cafile)
        cfg.server_name = host
    async with connect(host, port, configuration=cfg, create_protocol=Client) as client:
        for path in paths:
            try:
                body = await client.get(path)
            except Exception as e:  # a reset, a timeout: reported, not fatal
                print(json.dumps({"path": path, "error": str(e)}), flush=True)
                continue
            name = os.path.basename(path) or "index.html"
            with open(os.path.join(outdir, name), "wb") as f:
                f.write(body)
            print(json.dumps({"path": path, "bytes": len(body)}), flush=True)
        client.close()
        await client.wait_closed()
    print(json.dumps({"done": len(paths)}), flush=True)


class Server(QuicConnectionProtocol):
    root = "."

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h0 = H0Connection(self._quic)

    def quic_event_received(self, event):
        for e in self.h0.handle_event(event):
            if isinstance(e, HeadersReceived):
                path = dict(e.headers)[b":path"].decode()
                full = os.path.realpath(os.path.join(self.root, path.lstrip("/")))
                if not full.startswith(self.root + os.sep) or not os.path.isfile(full):
                    self._quic.reset_stream(e.stream_id, 404)
                else:
                    with open(full, "rb") as f:
                        self.h0.send_headers(e.stream_id, [(b":status", b"200")])
                        self.h0.send_data(e.stream_id, f.read(), end_stream=True)
                self.transmit()


async def serve_for(host, port, root, cert, key, secs):
    cfg = QuicConfiguration(is_client=False, alpn_protocols=H0_ALPN)
    cfg.load_cert_chain(cert, key)
    Server.root = os.path.realpath(root)
    server = await serve(host, port, configuration=cfg, create_protocol=Server)
    print(json.dumps({"ready": port}), flush=True)
    await asyncio.sleep(secs)
    server.close()


def main():
    mode = sys.argv[1]
    if mode == "get":
        host, port, outdir, cafile = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        asyncio.run(get(host, port, outdir, cafile, sys.argv[6:]))
    elif mode == "serve":
        host, port, root, cert, key, secs = sys.argv[2:8]
        asyncio.run(serve_for(host, int(port), root, cert, key, float(secs)))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
