"""A client that writes what it is told inside an intercepted tunnel, for the spelling tests.

Usage: through.py PROXY_HOST PROXY_PORT CAFILE CASES_JSON

Each case (a JSON object) gets a tunnel of its own: a CONNECT to "connect" through the
proxy, TLS naming "sni" (sent as given, a trailing dot kept) and trusting CAFILE only for
the chain (the name is not checked: the tests name hosts the certificate may spell
otherwise), ALPN "h2" or "http/1.1". Over HTTP/2 it sends "headers" (a list of [name,
value], pseudo-headers included) exactly as given: the h2 package's own checks and
normalisation are off, so what a server would refuse goes out all the same. Over HTTP/1.1 it
writes "raw" byte for byte. It prints one line per case: the response status, "reset:CODE"
for a reset stream, "goaway:CODE", "closed", "connect:STATUS" for a refused CONNECT, or
"tls:ERROR" for a failed handshake. Every read is bounded (10 s, 1 MiB).
"""

import json
import socket
import ssl
import sys

import h2.config
import h2.connection
import h2.events

MAX = 1 << 20


def tunnel(proxy, case, cafile):
    s = socket.create_connection(proxy, timeout=10)
    target = case["connect"]
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head and len(head) < MAX:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    fields = head.split()
    status = fields[1].decode() if len(fields) > 1 else "0"
    if status != "200":
        s.close()
        return None, f"connect:{status}"
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = False
    ctx.set_alpn_protocols([case.get("alpn", "h2")])
    try:
        return ctx.wrap_socket(s, server_hostname=case["sni"]), None
    except (ssl.SSLError, OSError) as e:
        return None, f"tls:{e}"


def over_h2(tls, case):
    config = h2.config.H2Configuration(
        client_side=True,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        split_outbound_cookies=False,
        validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    headers = [(n.encode(), v.encode()) for n, v in case["headers"]]
    conn.send_headers(1, headers, end_stream=True)
    tls.sendall(conn.data_to_send())
    received = 0
    while received < MAX:
        try:
            data = tls.recv(65536)
        except (ssl.SSLError, OSError):
            return "closed"
        if not data:
            return "closed"
        received += len(data)
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == 1:
                return dict(ev.headers)[b":status"].decode()
            if isinstance(ev, h2.events.StreamReset) and ev.stream_id == 1:
                return f"reset:{int(ev.error_code)}"
            if isinstance(ev, h2.events.ConnectionTerminated):
                return f"goaway:{int(ev.error_code)}"
        out = conn.data_to_send()
        if out:
            tls.sendall(out)
    return "closed"


def over_h1(tls, case):
    tls.sendall(case["raw"].encode())
    head = b""
    while b"\r\n" not in head and len(head) < MAX:
        try:
            chunk = tls.recv(4096)
        except (ssl.SSLError, OSError):
            break
        if not chunk:
            break
        head += chunk
    fields = head.split()
    return fields[1].decode() if len(fields) > 1 else "closed"


def main():
    proxy = (sys.argv[1], int(sys.argv[2]))
    cafile = sys.argv[3]
    for case in json.loads(sys.argv[4]):
        tls, refused = tunnel(proxy, case, cafile)
        if refused is not None:
            print(refused, flush=True)
            continue
        try:
            if case.get("alpn", "h2") == "h2":
                if tls.selected_alpn_protocol() != "h2":
                    print(f"alpn:{tls.selected_alpn_protocol()}", flush=True)
                    continue
                print(over_h2(tls, case), flush=True)
            else:
                print(over_h1(tls, case), flush=True)
        finally:
            tls.close()


main()
