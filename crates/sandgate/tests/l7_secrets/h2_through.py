"""An HTTP/2 client through a sandgate CONNECT, for the l7_secrets tests' Python scripts
(imported through PYTHONPATH, `H2_THROUGH` in mod.rs): the CONNECT, TLS with ALPN h2 over the
tunnel, and a bounded read loop. Each script writes its own streams and what it prints."""
import socket, ssl, time
import h2.config, h2.connection, h2.events


def connect(proxy, host, port, source="127.0.0.1"):
    """A CONNECT to host:port through the proxy on 127.0.0.1:proxy, from the address
    `source`: the socket and the proxy's response head, or None and the head so far when the
    proxy closed first."""
    s = socket.create_connection(("127.0.0.1", int(proxy)), timeout=10, source_address=(source, 0))
    s.sendall(("CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n" % (host, port, host, port)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            return None, head
        head += b
    return s, head


def session(s, host, cafile):
    """TLS over the tunnel `s`, trusting `cafile`, with h2 negotiated (checked), and an HTTP/2
    client connection begun on it: the TLS socket and the h2 connection."""
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["h2"])
    t = ctx.wrap_socket(s, server_hostname=host)
    assert t.selected_alpn_protocol() == "h2", t.selected_alpn_protocol()
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    return t, c


def pump(t, c, until, deadline, on_event):
    """Reads the connection until `until()` holds, the monotonic `deadline` passes or the
    connection ends, handing each h2 event to `on_event` and sending what the connection has
    to send after each read."""
    t.settimeout(0.2)
    while not until() and time.monotonic() < deadline:
        try:
            data = t.recv(65536)
        except socket.timeout:
            continue
        if not data:
            break
        for ev in c.receive_data(data):
            on_event(ev)
        t.sendall(c.data_to_send())
