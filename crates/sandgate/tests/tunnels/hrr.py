"""A TLS 1.3 HelloRetryRequest through the proxy, with crafted ClientHellos.

server CERT KEY: an OpenSSL server (Python's ssl) on 127.0.0.1:0 that accepts only the
  secp384r1 group, so a client offering only an x25519 key share gets a HelloRetryRequest.
  Prints its port, then one line per server-name callback ("sni NAME") and per handshake.
client PROXY TARGET SNI1 SNI2: CONNECT to TARGET, a first ClientHello naming SNI1 with no
  key share (forcing the retry), then ChangeCipherSpec and a second ClientHello naming SNI2.
  Prints JSON: whether a HelloRetryRequest came, and what came after the second hello.
"""
import json
import os
import socket
import ssl
import struct
import sys
import threading

HRR = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")


def u16(x):
    return struct.pack(">H", x)


def ext(t, body):
    return u16(t) + u16(len(body)) + body


def client_hello(name, key_share, random, sid):
    host = name.encode()
    sni = ext(0, u16(len(host) + 3) + b"\x00" + u16(len(host)) + host)
    exts = [
        sni,
        ext(0x002B, b"\x02\x03\x04"),  # supported_versions: TLS 1.3
        ext(0x000A, u16(4) + u16(0x001D) + u16(0x0018)),  # groups: x25519, secp384r1
        ext(0x000D, u16(4) + u16(0x0804) + u16(0x0403)),  # signature algorithms
    ]
    if key_share is None:
        exts.append(ext(0x0033, u16(0)))
    else:
        group, size = key_share
        if group == 0x0018:  # an uncompressed P-384 point: a real one from the cryptography-free way
            share = b"\x04" + os.urandom(size - 1)
        else:
            share = os.urandom(size)
        ks = u16(group) + u16(len(share)) + share
        exts.append(ext(0x0033, u16(len(ks)) + ks))
    e = b"".join(exts)
    suites = u16(0x1301) + u16(0x1302)
    body = u16(0x0303) + random + bytes([len(sid)]) + sid + u16(len(suites)) + suites + b"\x01\x00" + u16(len(e)) + e
    return b"\x01" + struct.pack(">I", len(body))[1:] + body


def record(payload, typ=0x16, ver=0x0301):
    return bytes([typ]) + u16(ver) + u16(len(payload)) + payload


def server(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    ctx.set_ecdh_curve("secp384r1")
    ctx.sni_callback = lambda sock, name, c: print(f"sni {name}", flush=True)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    print(ls.getsockname()[1], flush=True)

    def handle(c):
        c.settimeout(10)
        try:
            s = ctx.wrap_socket(c, server_side=True)
            print("handshake done", flush=True)
            s.close()
        except Exception as e:
            print(f"handshake failed: {type(e).__name__}", flush=True)

    for _ in range(16):
        c, _ = ls.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def client(proxy, target, sni1, sni2):
    s = socket.create_connection(("127.0.0.1", int(proxy)), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    random, sid = os.urandom(32), os.urandom(32)
    s.sendall(record(client_hello(sni1, None, random, sid)))
    first = b""
    while len(first) < 43:
        chunk = s.recv(4096)
        if not chunk:
            break
        first += chunk
    retried = first[11:43] == HRR
    out = {"status": head.split(b"\r\n")[0].decode(), "retry": retried}
    if retried:
        s.sendall(record(b"\x01", typ=0x14, ver=0x0303) + record(client_hello(sni2, (0x0018, 97), random, sid), ver=0x0303))
        try:
            after = s.recv(4096)
        except OSError as e:
            after = b""
            out["error"] = type(e).__name__
        out["after"] = after[:7].hex()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(*sys.argv[2:4])
    else:
        client(*sys.argv[2:6])
