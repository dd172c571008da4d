"""A git smart-HTTP origin: `git http-backend` run as CGI (RFC 3875) behind a small HTTP/1.1
server on 127.0.0.1:0.

usage: git_http_server.py PROJECT_ROOT [CERT KEY]

With CERT and KEY (PEM files: a certificate and its private key) it serves HTTPS instead,
each connection's TLS handshake on that connection's own thread, bounded to 30 s, so a
client that never finishes one holds up no other.
Serves every repository under PROJECT_ROOT (GIT_HTTP_EXPORT_ALL); a bare repository with
`http.receivepack true` accepts pushes without a login. Prints its port on the first line of
stdout, then one line per request received, `REQ METHOD TARGET HOST` (the request-target as
sent, and the Host field), before the request is handled, so a test can tell whether a refused request reached it.
Request bodies are streamed to the backend, framed by Content-Length or chunked (git sends
chunked once a push exceeds http.postBuffer); responses are streamed back, chunked unless the
backend gave a length. Exits when its stdin closes (the test holding it ended).
"""
import http.server
import os
import ssl
import subprocess
import sys
import threading
import urllib.parse

PROJECT_ROOT = sys.argv[1]
CHUNK = 64 * 1024


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def cgi(self):
        print(f"REQ {self.command} {self.path} {self.headers.get('Host', '-')}", flush=True)
        path, _, query = self.path.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": PROJECT_ROOT,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": self.request_version,
            "REQUEST_METHOD": self.command,
            "PATH_INFO": urllib.parse.unquote(path),
            "QUERY_STRING": query,
            "REMOTE_ADDR": self.client_address[0],
        }
        for name, value in self.headers.items():
            key = name.upper().replace("-", "_")
            if key == "CONTENT_TYPE":
                env["CONTENT_TYPE"] = value
            elif key == "CONTENT_LENGTH":
                env["CONTENT_LENGTH"] = value
            elif key not in ("TRANSFER_ENCODING", "CONNECTION"):
                env["HTTP_" + key] = value
        backend = subprocess.Popen(
            ["git", "http-backend"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        feeder = threading.Thread(target=self.feed, args=(backend.stdin,))
        feeder.start()
        try:
            self.relay(backend.stdout)
        finally:
            feeder.join(timeout=30)
            backend.wait(timeout=30)

    def feed(self, sink):
        """Copies the request body to the backend's stdin, then closes it (EOF ends it)."""
        try:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    copy(self.rfile, sink, size)
                    self.rfile.readline()
            else:
                copy(self.rfile, sink, int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.close_connection = True
        finally:
            try:
                sink.close()
            except OSError:
                pass

    def relay(self, source):
        """Turns the backend's CGI response into an HTTP/1.1 response, streamed."""
        status, fields = "200 OK", []
        while True:
            line = source.readline().decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            else:
                fields.append((name, value.strip()))
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason or None)
        length = next((v for n, v in fields if n.lower() == "content-length"), None)
        for name, value in fields:
            self.send_header(name, value)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.command == "HEAD":
            source.read()
            return
        while True:
            data = source.read1(CHUNK)
            if not data:
                break
            if length is None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self.wfile.write(data)
        if length is None:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = cgi


def copy(source, sink, n):
    """Copies n bytes; once the backend stops reading, drains the rest so the connection stays
    in step for its next request."""
    while n > 0:
        data = source.read(min(n, CHUNK))
        if not data:
            raise ValueError("request body ended early")
        if not sink.closed:
            try:
                sink.write(data)
            except OSError:
                sink.close()
        n -= len(data)


class TlsServer(http.server.ThreadingHTTPServer):
    def __init__(self, address, handler, context):
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request, client_address):
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


def main():
    if len(sys.argv) == 4:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[2], sys.argv[3])
        server = TlsServer(("127.0.0.1", 0), Handler, context)
    else:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


main()
