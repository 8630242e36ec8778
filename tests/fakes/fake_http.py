"""What the fake model APIs (fake_openai.py, fake_anthropic.py) share: the HTTP handler's
plumbing (JSON answers, event streams cut at odd byte boundaries, an abrupt drop), the request
counts scenarios use to act differently on retries (and GET /_count?user=TEXT), and the process
around the server (the port on stdout's first line, serving until stdin closes).

A fake subclasses FakeHandler, defines send_error_json in its API's error format (and not_found
when its send_error_json takes other arguments than (status, message)) and do_POST, and calls
serve(ItsHandler) from main.
"""

import json
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_lock = threading.Lock()
_counts = {}  # (model, user text) -> requests seen
_user_counts = {}  # user text -> requests seen


def count_request(model, user):
    """Counts one request; returns how many (model, user) has seen, this one included."""
    with _lock:
        n = _counts[(model, user)] = _counts.get((model, user), 0) + 1
        _user_counts[user] = _user_counts.get(user, 0) + 1
    return n


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer's head and body leave in two writes: without TCP_NODELAY the second waits for
    # the client's delayed ACK of the first (40 ms on Linux), which no real API server adds.
    disable_nagle_algorithm = True
    api_key = "test-key"  # serve() sets it from --key

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status, obj, extra_headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self, chunked=True):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()

    def write_piece(self, data, chunked=True):
        if chunked:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.wfile.write(data)
        self.wfile.flush()

    def stream(self, events, chunked=True, crlf=False, end=True):
        """Sends events cut at odd byte boundaries, pausing between pieces. end=False leaves a
        chunked body unterminated (a cut stream)."""
        self.start_stream(chunked)
        payload = "".join(events)
        if crlf:
            payload = payload.replace("\n", "\r\n")
        data = payload.encode()
        sizes = [1, 7, 3, 64, 13, 2, 29]
        pos = 0
        i = 0
        while pos < len(data):
            n = sizes[i % len(sizes)]
            self.write_piece(data[pos:pos + n], chunked)
            pos += n
            i += 1
            time.sleep(0.001)
        if chunked and end:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def not_found(self, message):
        """A 404 in the API's error format (a fake overrides it when its send_error_json differs)."""
        self.send_error_json(404, message)

    def drop(self):
        """Closes the connection abruptly, whatever was sent so far."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path != "/_count":
            return self.not_found("no such path: " + url.path)
        user = urllib.parse.parse_qs(url.query).get("user", [""])[0]
        with _lock:
            n = _user_counts.get(user, 0)
        self.send_json(200, {"count": n})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog (5) drops the SYNs of a burst of new connections, which the
    # client then sends again a second later; a real API server's backlog is far longer.
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # Clients hang up once they have what they need; only real faults are worth a trace.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def serve(handler):
    """Runs a fake: [--key KEY], the port on stdout's first line, until stdin closes."""
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--key":
        handler.api_key = args[1]
    server = Server(("127.0.0.1", 0), handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sys.stdin.read()  # returns at EOF: the test that started us is gone
    except KeyboardInterrupt:
        pass
    server.shutdown()
