"""Test harness for Keel integration tests: a real `keel serve` process over HTTP.

Stdlib only. Typical use:

    class MyTest(KeelTestCase):
        @classmethod
        def setUpClass(cls):
            cls.server = KeelServer()          # starts and waits for /readyz

        @classmethod
        def tearDownClass(cls):
            cls.server.stop()

        def test_x(self):
            status, body, _ = self.server.request("GET", "/v1/agents")

Environment:
    KEEL_BIN         the keel binary (default: ../../build/keel relative to this file)
    KEEL_TEST_STORE  unset: the default SQLite store in KEEL_HOME. The word `postgres`: each
                     KeelServer creates its own fresh database on the server of
                     KEEL_TEST_PG_ADMIN_URL (owned by the owner role `keel_owner`, or by the user
                     of KEEL_TEST_PG_OWNER_URL), runs keel with `--store postgres://keel@HOST:PORT/DB`
                     (the runtime role, which owns nothing) and KEEL_STORE_OWNER set to the owner
                     role's URL (it migrates), and drops the database in stop(); without
                     KEEL_TEST_PG_ADMIN_URL the test module exits with status 77 (ctest:
                     skipped). Any other value is passed to the server as `--store URL`.
    KEEL_TEST_PG_ADMIN_URL  a PostgreSQL role that may create databases (make test sets it)
    KEEL_TEST_PG_URL        optional: the store's runtime role and server (default: user `keel`
                            on the admin URL's server)
    KEEL_TEST_PG_OWNER_URL  optional: the role that owns the schema (default: user `keel_owner`
                            on the admin URL's server)
    KEEL_TEST_KEEP   when set to 1, temporary homes are kept for inspection
"""

import atexit
import base64
import hashlib
import http.client
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.path.normpath(os.path.join(HERE, "..", "..", "build", "keel"))

TERMINAL_RUN_STATES = ("done", "failed", "cancelled")
WAIT_RETURN_STATES = TERMINAL_RUN_STATES + ("waiting_for_approval",)

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*@v[0-9]+$")

_DEFAULT = object()

# Exit status that ctest reports as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
SKIP_EXIT_CODE = 77

if os.environ.get("KEEL_TEST_STORE") == "postgres" and not os.environ.get("KEEL_TEST_PG_ADMIN_URL"):
    sys.stderr.write("SKIPPED: KEEL_TEST_STORE=postgres needs KEEL_TEST_PG_ADMIN_URL, a PostgreSQL "
                     "role that may create databases (`make test` starts a throwaway cluster and "
                     "sets it; or run under scripts/with-pg.sh)\n")
    sys.exit(SKIP_EXIT_CODE)


def keel_bin():
    path = os.environ.get("KEEL_BIN") or DEFAULT_BIN
    return path


def parse_time(text):
    """RFC 3339 with milliseconds ("2026-11-30T12:00:00.000Z") -> aware datetime."""
    if text is None:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def unique_name(prefix="t"):
    return prefix + "-" + "".join(random.choice(string.ascii_lowercase + string.digits)
                                  for _ in range(10))


def wait_for(predicate, timeout=20, what="condition", interval=0.05):
    """Polls predicate() until it returns a true value (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("%s not met within %ss (last: %r)" % (what, timeout, last))


class FakeOpenAi:
    """tests/fakes/fake_openai.py in a process of its own: the model named by an agent's
    `openai/SCENARIO` picks its scripted answer. `env` points a server at it."""

    def __init__(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes",
                              "fake_openai.py")
        self.proc = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().strip())
        self.env = {"OPENAI_BASE_URL": "http://127.0.0.1:%d/v1" % self.port,
                    "OPENAI_API_KEY": "test-key"}

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


class ServerDied(Exception):
    pass


# ---------------------------------------------------------------------- PostgreSQL databases

_PG_DATABASES = set()  # created and not yet dropped; dropped at exit if a test forgot stop()


def _pg_url_with(url, user=None, db=None):
    """url with its user (and password) and/or database replaced."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        netloc = user + "@" + netloc.rpartition("@")[2]
    path = "/" + db if db is not None else parts.path
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


def _psql_admin(sql):
    admin = os.environ["KEEL_TEST_PG_ADMIN_URL"]
    proc = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", admin, "-c", sql],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError("psql %r failed (%s): %s" % (sql, proc.returncode, proc.stderr.strip()))


def create_pg_database():
    """Creates a fresh database for one server, owned by the owner role; returns (name, store URL
    as the runtime role `keel`)."""
    admin = os.environ["KEEL_TEST_PG_ADMIN_URL"]
    base = os.environ.get("KEEL_TEST_PG_URL") or _pg_url_with(admin, user="keel")
    owner = urllib.parse.urlsplit(pg_owner_url(admin)).username
    name = "keel_it_" + "".join(random.choice(string.ascii_lowercase + string.digits)
                                for _ in range(12))
    _psql_admin('CREATE DATABASE %s OWNER "%s"' % (name, owner))
    _PG_DATABASES.add(name)
    return name, _pg_url_with(base, db=name)


def pg_owner_url(url):
    """`url` (a store URL) as the owner role: KEEL_STORE_OWNER of a server on that store."""
    owner = os.environ.get("KEEL_TEST_PG_OWNER_URL")
    userinfo = urllib.parse.urlsplit(owner).netloc.rpartition("@")[0] if owner else ""
    return _pg_url_with(url, user=userinfo or "keel_owner")


def drop_pg_database(name):
    if name in _PG_DATABASES:
        _PG_DATABASES.discard(name)
        _psql_admin("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


@atexit.register
def _drop_leftover_pg_databases():
    if os.environ.get("KEEL_TEST_KEEP"):
        return
    for name in list(_PG_DATABASES):
        try:
            drop_pg_database(name)
        except Exception as e:  # noqa: BLE001 - best effort at exit
            sys.stderr.write("keel_harness: could not drop database %s: %s\n" % (name, e))


class KeelServer:
    """One `keel serve` process with its own KEEL_HOME.

    home:  a directory to use (kept); default a fresh temporary directory (removed by stop()).
    env:   extra environment variables for the server (e.g. {"KEEL_TENANT_RUN_CAP": "2"}).
    args:  extra command-line arguments after `serve`.
    start: start at once (default) and wait until /readyz answers 200.
    store_url: share this store (e.g. another server's `store_url`: a second node on the same
           PostgreSQL database) instead of the one KEEL_TEST_STORE gives; the database is then
           not this server's to drop.
    token: the owner token to use (a second node on a shared store does not bootstrap the
           tenant, so it writes no owner.token: pass the first node's).
    """

    def __init__(self, home=None, env=None, args=None, start=True, ready_timeout=30.0,
                 store_url=None, token=None):
        self.bin = keel_bin()
        if not os.path.exists(self.bin):
            raise RuntimeError("KEEL_BIN does not exist: %r (build keel first, or set KEEL_BIN)"
                               % self.bin)
        self._own_home = home is None
        self.home = home or tempfile.mkdtemp(prefix="keel-it-")
        os.makedirs(self.home, exist_ok=True)
        self.extra_env = dict(env or {})
        self.extra_args = list(args or [])
        # The store: KEEL_TEST_STORE=postgres gives every server its own fresh database.
        self.pg_database = None
        self.store_url = store_url or os.environ.get("KEEL_TEST_STORE") or None
        if store_url is None and self.store_url == "postgres":
            self.pg_database, self.store_url = create_pg_database()
        self.ready_timeout = ready_timeout
        self.proc = None
        self.addr = None  # "127.0.0.1:PORT"
        self.token = token  # the owner token of the first tenant (platform admin)
        self.starts = 0
        self.stdout_path = os.path.join(self.home, "server.stdout.log")
        self.stderr_path = os.path.join(self.home, "server.stderr.log")
        self._lock = threading.Lock()
        if start:
            self.start()

    # ------------------------------------------------------------------ process control

    @property
    def base_url(self):
        return "http://" + self.addr if self.addr else None

    def _command(self, listen):
        cmd = [self.bin, "serve", "--home", self.home, "--listen", listen]
        if self.store_url:
            cmd += ["--store", self.store_url]
        return cmd + self.extra_args

    def _environment(self):
        # Hermetic: no KEEL_* setting of the caller's environment leaks into the server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["KEEL_HOME"] = self.home
        if self.store_url:
            env["KEEL_STORE"] = self.store_url
            if self.store_url.startswith(("postgres://", "postgresql://")) and \
                    os.environ.get("KEEL_TEST_PG_ADMIN_URL"):
                env["KEEL_STORE_OWNER"] = pg_owner_url(self.store_url)
        env.update(self.extra_env)
        return env

    def start(self, listen="127.0.0.1:0"):
        addr_file = os.path.join(self.home, "listen.addr")
        try:
            os.unlink(addr_file)
        except FileNotFoundError:
            pass
        self.starts += 1
        banner = "\n===== keel start #%d at %s: %s =====\n" % (
            self.starts, time.strftime("%H:%M:%S"), " ".join(self._command(listen)))
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        out.write(banner.encode())
        err.write(banner.encode())
        out.flush()
        err.flush()
        try:
            self.proc = subprocess.Popen(self._command(listen), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, env=self._environment(),
                                         cwd=self.home)
        finally:
            out.close()
            err.close()
        self.addr = None
        self._wait_ready(addr_file)
        return self

    def _wait_ready(self, addr_file):
        deadline = time.monotonic() + self.ready_timeout
        last_error = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDied("keel exited with status %s before it was ready\n%s"
                                 % (self.proc.returncode, self.log_tail()))
            # Re-read every time: a partly written file would give a wrong port.
            try:
                with open(addr_file) as f:
                    text = f.read().strip()
                if text and re.match(r"^[^\s:]+:\d+$", text) and not text.endswith(":0"):
                    self.addr = text
            except FileNotFoundError:
                pass
            if self.addr is not None:
                tok = self._read_owner_token()
                if tok:
                    self.token = tok
                try:
                    status, _, _ = self.request("GET", "/readyz", token=None, timeout=2)
                    if status == 200 and self.token:
                        self.token = self._read_owner_token() or self.token
                        if self.starts == 1:
                            st, body, _ = self.request("GET", "/v1/agents", timeout=10)
                            if st != 200:
                                raise ServerDied("the owner token from owner.token is refused: "
                                                 "GET /v1/agents -> %s %r\n%s"
                                                 % (st, body, self.log_tail()))
                        return
                    last_error = "readyz answered %s" % status
                except (OSError, http.client.HTTPException) as e:
                    last_error = repr(e)
            time.sleep(0.02)
        raise ServerDied("keel was not ready within %.0fs (addr=%s, token=%s, last: %s)\n%s"
                         % (self.ready_timeout, self.addr, bool(self.token), last_error,
                            self.log_tail()))

    def _read_owner_token(self):
        path = os.path.join(self.home, "owner.token")
        try:
            with open(path) as f:
                tok = f.read().strip()
            return tok or None
        except FileNotFoundError:
            return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        """SIGKILL the process and reap it."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait(timeout=30)

    def terminate(self, timeout=30):
        """SIGTERM (drain and stop) and wait; returns the exit status."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("keel did not stop within %ss of SIGTERM\n%s"
                                     % (timeout, self.log_tail()))
        self.check_sanitizer_reports()
        return self.proc.returncode if self.proc else None

    # What the sanitizers print when they find something (make test-sanitize, make test-tsan);
    # UndefinedBehaviorSanitizer's lines start with the source position.
    SANITIZER_REPORTS = re.compile(r"WARNING: ThreadSanitizer|ERROR: AddressSanitizer|"
                                   r"ERROR: LeakSanitizer|\.\w+:\d+:\d+: runtime error: ")

    def check_sanitizer_reports(self):
        """Fails when a sanitizer reported in the server's log: a race, a leak found at exit or
        undefined behaviour seen while the server stops would otherwise pass unnoticed."""
        try:
            with open(self.stderr_path, errors="replace") as f:
                log = f.read()
        except FileNotFoundError:
            return
        found = self.SANITIZER_REPORTS.search(log)
        if found:
            at = found.start()
            raise AssertionError("a sanitizer reported in %s:\n%s"
                                 % (self.stderr_path, log[at:at + 6000]))

    def restart(self, kill=False):
        """Stops (SIGTERM, or SIGKILL with kill=True) and starts again on the same home."""
        if kill:
            self.kill9()
        else:
            self.terminate()
        return self.start()

    def stop(self):
        """Stops the server (SIGTERM, then SIGKILL), removes a temporary home and drops the
        server's own PostgreSQL database."""
        if self.proc and self.proc.poll() is None:
            try:
                self.terminate(timeout=15)
            except AssertionError:
                pass
        report = None
        try:
            self.check_sanitizer_reports()
        except AssertionError as e:
            report = e
        if self._own_home and not os.environ.get("KEEL_TEST_KEEP"):
            shutil.rmtree(self.home, ignore_errors=True)
        if self.pg_database and not os.environ.get("KEEL_TEST_KEEP"):
            drop_pg_database(self.pg_database)
            self.pg_database = None
        if report:
            raise report

    def store_contents(self):
        """What the store keeps at rest, as a list of (label, bytes), for checks such as "no token
        in plaintext": the SQLite files in KEEL_HOME (keel.db, -wal, -shm), or a data-only
        pg_dump of this server's own PostgreSQL database."""
        if self.pg_database:
            url = _pg_url_with(os.environ["KEEL_TEST_PG_ADMIN_URL"], db=self.pg_database)
            proc = subprocess.run(["pg_dump", "--data-only", "--dbname=" + url],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError("pg_dump failed: %s" % proc.stderr.decode(errors="replace"))
            return [("pg_dump of " + self.pg_database, proc.stdout)]
        out = []
        for name in sorted(os.listdir(self.home)):
            path = os.path.join(self.home, name)
            if name.startswith("keel.db") and os.path.isfile(path):
                with open(path, "rb") as f:
                    out.append((path, f.read()))
        return out

    def log_tail(self, lines=60):
        chunks = []
        for path in (self.stderr_path, self.stdout_path):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - 64 * 1024))
                    text = f.read().decode("utf-8", "replace")
                tail = "\n".join(text.splitlines()[-lines:])
                chunks.append("----- %s (last %d lines) -----\n%s" % (path, lines, tail))
            except FileNotFoundError:
                chunks.append("----- %s: missing -----" % path)
        return "\n".join(chunks)

    # ------------------------------------------------------------------ HTTP

    def request(self, method, path, body=None, token=_DEFAULT, headers=None, timeout=30,
                raw_body=None):
        """Sends one request. Returns (status, parsed JSON or text, headers as a lower-cased dict).

        token: the bearer token; default the owner token; None sends no Authorization header.
        body:  a value serialized as JSON; raw_body: bytes/str sent as is (for bad-input tests).
        """
        if self.addr is None:
            raise ConnectionRefusedError("keel is not running")
        return http_request(self.addr, method, path, body=body,
                            token=self.token if token is _DEFAULT else token,
                            headers=headers, timeout=timeout, raw_body=raw_body)

    def ok(self, method, path, body=None, expect=(200, 201, 202, 204), **kw):
        """request() that fails loudly unless the status is one of `expect`."""
        status, data, hdrs = self.request(method, path, body=body, **kw)
        if isinstance(expect, int):
            expect = (expect,)
        if status not in expect:
            raise AssertionError("%s %s -> %s (expected %s): %s\n%s" % (
                method, path, status, expect, data, self.log_tail(30)))
        return data

    # ------------------------------------------------------------------ resource helpers

    def create_agent(self, name=None, model="local", instructions="You are a test agent.",
                     tools=None, config=None, token=_DEFAULT):
        body = {"name": name or unique_name("agent"), "model": model,
                "instructions": instructions, "tools": tools if tools is not None else [],
                "config": config or {}}
        return self.ok("POST", "/v1/agents", body, expect=201, token=token)

    def create_session(self, agent_id, title="test session", token=_DEFAULT):
        return self.ok("POST", "/v1/agents/%s/sessions" % agent_id, {"title": title},
                       expect=201, token=token)

    def post_message(self, session_id, content, wait=None, idempotency_key=None,
                     token=_DEFAULT, timeout=60):
        """Posts a message; returns (status, body, headers); body {"message","run"} on success."""
        path = "/v1/sessions/%s/messages" % session_id
        if wait is not None:
            path += "?wait=%s" % wait
        headers = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return self.request("POST", path, {"content": content}, token=token, headers=headers,
                            timeout=timeout)

    def send(self, session_id, content, wait=10, token=_DEFAULT, **kw):
        """Posts a message with ?wait= and returns the body; the run must have ended."""
        status, body, _ = self.post_message(session_id, content, wait=wait, token=token, **kw)
        if status not in (200, 202):
            raise AssertionError("POST message -> %s: %s\n%s" % (status, body, self.log_tail(30)))
        return body

    def get_run(self, run_id, token=_DEFAULT):
        return self.ok("GET", "/v1/runs/%s" % run_id, expect=200, token=token)

    def wait_run(self, run_id, states=TERMINAL_RUN_STATES, timeout=30, token=_DEFAULT):
        deadline = time.monotonic() + timeout
        run = None
        while time.monotonic() < deadline:
            run = self.get_run(run_id, token=token)
            if run.get("status") in states:
                return run
            time.sleep(0.05)
        raise AssertionError("run %s did not reach %s within %ss; last: %s\n%s"
                             % (run_id, states, timeout, run, self.log_tail(30)))

    def steps(self, run_id, token=_DEFAULT):
        data = self.ok("GET", "/v1/runs/%s/steps" % run_id, expect=200, token=token)
        return data["items"] if isinstance(data, dict) and "items" in data else data

    def list_all(self, path, limit=None, token=_DEFAULT, max_pages=10000):
        """Follows next_cursor through every page of a list route; returns all items."""
        items = []
        cursor = None
        for _ in range(max_pages):
            params = {}
            if limit is not None:
                params["limit"] = str(limit)
            if cursor:
                params["cursor"] = cursor
            sep = "&" if "?" in path else "?"
            full = path + (sep + urllib.parse.urlencode(params) if params else "")
            data = self.ok("GET", full, expect=200, token=token)
            items.extend(data["items"])
            cursor = data.get("next_cursor")
            if not cursor:
                return items
        raise AssertionError("list %s did not end after %d pages" % (path, max_pages))

    def all_events(self, after=0, limit=500, token=_DEFAULT):
        """Pages through GET /v1/events?after= and returns every event after `after`."""
        events = []
        while True:
            data = self.ok("GET", "/v1/events?after=%d&limit=%d" % (after, limit), expect=200,
                           token=token)
            page = data["items"]
            if not page:
                return events
            events.extend(page)
            after = page[-1]["position"]
            if len(page) < limit and not data.get("next_cursor"):
                # A short page: the log is read to its end (for now).
                return events


def pick_up(nodes, rng):
    """(addr, token) of a random node of `nodes` that is up, or None. A node's address is read
    once: a restart (KeelServer.start) clears it while another thread picks."""
    up = []
    for n in nodes:
        addr = n.addr
        if addr and n.alive():
            up.append((addr, n.token))
    return rng.choice(up) if up else None


def http_request(addr, method, path, body=None, token=None, headers=None, timeout=30,
                 raw_body=None):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        hdrs = {"Accept": "application/json"}
        payload = None
        if raw_body is not None:
            payload = raw_body.encode() if isinstance(raw_body, str) else raw_body
            hdrs["Content-Type"] = "application/json"
        elif body is not None:
            payload = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if token:
            hdrs["Authorization"] = "Bearer " + token
        if headers:
            hdrs.update(headers)
        conn.request(method, path, body=payload, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        resp_headers = {k.lower(): v for k, v in resp.getheaders()}
        text = data.decode("utf-8", "replace")
        parsed = text
        ctype = resp_headers.get("content-type", "")
        if text and ("json" in ctype or text[:1] in "{["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = text
        elif not text:
            parsed = None
        return resp.status, parsed, resp_headers
    finally:
        conn.close()


# ---------------------------------------------------------------------- Server-Sent Events


class SseClient:
    """Reads a Server-Sent Events stream in a thread and queues its events.

    url: a full URL ("http://127.0.0.1:PORT/v1/stream?session_id=...") or a path with `addr`.
    Each queued event is a dict {"id": str|None, "event": str|None, "data": parsed JSON or str,
    "raw_data": str}. A dict {"closed": True, "error": ...} is queued when the stream ends.
    """

    def __init__(self, url, token, last_event_id=None, timeout=60):
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname
        self.port = parts.port
        self.path = parts.path + ("?" + parts.query if parts.query else "")
        self.token = token
        self.last_event_id = last_event_id
        self.events = queue.Queue()
        self.status = None
        self.headers = None
        self.closed = threading.Event()
        self._connected = threading.Event()
        self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self._resp = None
        self._sock = None
        self._error = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._connected.wait(timeout=30):
            raise AssertionError("SSE stream %s: no response headers within 30s" % url)
        if self._error is not None and self.status is None:
            raise AssertionError("SSE stream %s failed: %r" % (url, self._error))

    def _run(self):
        try:
            hdrs = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
            if self.token:
                hdrs["Authorization"] = "Bearer " + self.token
            if self.last_event_id is not None:
                hdrs["Last-Event-ID"] = str(self.last_event_id)
            self._conn.connect()
            self._sock = self._conn.sock  # kept: a Connection: close response detaches it
            if self.closed.is_set():
                return
            self._conn.request("GET", self.path, headers=hdrs)
            self._resp = self._conn.getresponse()
            self.status = self._resp.status
            self.headers = {k.lower(): v for k, v in self._resp.getheaders()}
            self._connected.set()
            if self.status != 200:
                body = self._resp.read().decode("utf-8", "replace")
                self.events.put({"closed": True, "error": "status %s: %s" % (self.status, body)})
                return
            ev = {"id": None, "event": None, "data": []}
            while not self.closed.is_set():
                line = self._resp.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if ev["data"] or ev["event"] or ev["id"] is not None:
                        raw = "\n".join(ev["data"])
                        try:
                            data = json.loads(raw) if raw else None
                        except ValueError:
                            data = raw
                        self.events.put({"id": ev["id"], "event": ev["event"], "data": data,
                                         "raw_data": raw})
                    ev = {"id": None, "event": None, "data": []}
                    continue
                if line.startswith(":"):
                    continue  # a comment (keep-alive)
                field, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if field == "data":
                    ev["data"].append(value)
                elif field == "event":
                    ev["event"] = value
                elif field == "id":
                    ev["id"] = value
            self.events.put({"closed": True, "error": None})
        except Exception as e:  # noqa: BLE001 - reported through the queue
            self._error = e
            self._connected.set()
            if not self.closed.is_set():
                self.events.put({"closed": True, "error": repr(e)})

    def next(self, timeout=10):
        """The next event, or None after `timeout` seconds."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def collect_until(self, predicate, timeout=20):
        """Collects events until predicate(event) is true (that event included). Raises on timeout
        or when the stream closes first."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("SSE: condition not met within %ss; got %d events: %s"
                                     % (timeout, len(got), [(e.get("id"), e.get("event"))
                                                            for e in got]))
            ev = self.next(timeout=left)
            if ev is None:
                continue
            if ev.get("closed"):
                raise AssertionError("SSE stream closed early (%s) after %d events"
                                     % (ev.get("error"), len(got)))
            got.append(ev)
            if predicate(ev):
                return got

    def drain(self, quiet=0.5):
        """Events that arrive until the stream is quiet for `quiet` seconds."""
        got = []
        while True:
            ev = self.next(timeout=quiet)
            if ev is None or ev.get("closed"):
                return got
            got.append(ev)

    def close(self):
        self.closed.set()
        sock = self._sock or self._conn.sock
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._conn.close()
        except OSError:
            pass
        self._thread.join(timeout=5)


class WebSocketClient(SseClient):
    """The live stream over a WebSocket (RFC 6455, written here on a plain socket): the same
    route as SseClient, upgraded, with the same interface and event dicts. Each text message is
    one JSON object: a stored event (its "position" becomes "id", its "type" "event") or a token
    delta ("type": "message.delta", no id). `last_event_id` is sent as ?after=. It answers pings
    and close frames as a client must, masking what it sends; `pings` counts the pings seen."""

    GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
    close_code = None  # of the server's close frame, once it came

    def __init__(self, url, token, last_event_id=None, timeout=60, headers=None):
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query)
        if last_event_id is not None:
            query.append(("after", str(last_event_id)))
        self.host, self.port = parts.hostname, parts.port
        self.path = parts.path + ("?" + urllib.parse.urlencode(query) if query else "")
        self.token = token
        self.extra_headers = headers or {}
        self.timeout = timeout
        self.events = queue.Queue()
        self.status = None
        self.headers = None
        self.body = b""
        self.pings = 0
        self.closed = threading.Event()
        self._connected = threading.Event()
        self._sock = None
        self._conn = None
        self._error = None
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._connected.wait(timeout=30):
            raise AssertionError("WebSocket %s: no handshake answer within 30s" % url)
        if self._error is not None and self.status is None:
            raise AssertionError("WebSocket %s failed: %r" % (url, self._error))

    def _read_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise EOFError("connection closed")
            out += chunk
        return out

    def send_frame(self, opcode, payload=b""):
        """One final frame, masked as a client's must be."""
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        with self._send_lock:
            self._sock.sendall(head + mask + body)

    def _read_frame(self):
        b0, b1 = self._read_exact(2)
        if b1 & 0x80:
            raise AssertionError("the server masked a frame (RFC 6455 5.1 forbids it)")
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(self._read_exact(2), "big")
        elif n == 127:
            n = int.from_bytes(self._read_exact(8), "big")
        return bool(b0 & 0x80), b0 & 0x0F, self._read_exact(n)

    def _run(self):
        try:
            self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            key = base64.b64encode(os.urandom(16)).decode()
            lines = ["GET %s HTTP/1.1" % self.path, "Host: %s:%s" % (self.host, self.port),
                     "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: " + key,
                     "Sec-WebSocket-Version: 13"]
            if self.token:
                lines.append("Authorization: Bearer " + self.token)
            lines += ["%s: %s" % kv for kv in self.extra_headers.items()]
            self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = self._sock.recv(1)
                if not chunk:
                    raise EOFError("closed during the handshake")
                head += chunk
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            self.status = int(status_line.split()[1])
            self.headers = {}
            for line in header_lines:
                if ":" in line:
                    k, v = line.split(":", 1)
                    self.headers[k.strip().lower()] = v.strip()
            if self.status != 101:
                length = int(self.headers.get("content-length", "0"))
                self.body = self._read_exact(length) if length else b""
                self._connected.set()
                self.events.put({"closed": True, "error": "status %s: %s" % (self.status,
                                                                            self.body[:200])})
                return
            accept = base64.b64encode(hashlib.sha1((key + self.GUID).encode()).digest()).decode()
            if self.headers.get("sec-websocket-accept") != accept:
                raise AssertionError("bad Sec-WebSocket-Accept: %r" % self.headers)
            self._sock.settimeout(None)
            self._connected.set()
            message, message_op = b"", None
            while not self.closed.is_set():
                fin, op, payload = self._read_frame()
                if op == 0x9:  # ping
                    self.pings += 1
                    self.send_frame(0xA, payload)
                    continue
                if op == 0xA:
                    continue
                if op == 0x8:  # close: answer it, and stop
                    self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 \
                        else None
                    self.send_frame(0x8, payload[:2])
                    break
                if op != 0x0:
                    message, message_op = b"", op
                message += payload
                if not fin:
                    continue
                if message_op != 0x1:
                    raise AssertionError("a non-text message (opcode %d)" % message_op)
                raw = message.decode("utf-8")
                data = json.loads(raw)
                self.events.put({"id": str(data["position"]) if "position" in data else None,
                                 "event": data.get("type"), "data": data, "raw_data": raw})
            self.events.put({"closed": True, "error": None})
        except Exception as e:  # noqa: BLE001 - reported through the queue
            self._error = e
            self._connected.set()
            if not self.closed.is_set():
                self.events.put({"closed": True, "error": repr(e)})

    def close(self):
        """Closes as a client should (a close frame), then the socket."""
        if self._sock is not None and self.status == 101 and not self.closed.is_set():
            try:
                self.send_frame(0x8, (1000).to_bytes(2, "big"))
            except OSError:
                pass
        self.closed.set()
        try:
            if self._sock is not None:
                self._sock.shutdown(socket.SHUT_RDWR)
                self._sock.close()
        except OSError:
            pass
        self._thread.join(timeout=5)


def sse_url(server, **filters):
    q = {k: v for k, v in filters.items() if v is not None}
    return server.base_url + "/v1/stream" + ("?" + urllib.parse.urlencode(q) if q else "")


# ---------------------------------------------------------------------- test case base


class Tenant:
    """A tenant of its own on a server (POST /v1/tenants): its owner token, that token's id, and
    requests made with it. Test modules extend it with helpers of their own."""

    def __init__(self, server):
        self.server = server
        body = server.ok("POST", "/v1/tenants", {"name": unique_name("tenant")}, expect=201)
        self.id = body["tenant"]["id"]
        self.token = body["owner_token"]
        tokens = server.ok("GET", "/v1/tokens", token=self.token)["items"]
        owners = [t for t in tokens if t["role"] == "owner"]
        assert len(owners) == 1, tokens
        self.token_id = owners[0]["id"]

    def request(self, method, path, body=None, token=None, **kw):
        return self.server.request(method, path, body=body, token=token or self.token, **kw)

    def ok(self, method, path, body=None, expect=(200, 201, 204), token=None, **kw):
        return self.server.ok(method, path, body, expect=expect, token=token or self.token, **kw)

    def new_token(self, role, name=None):
        """Creates a token of `role`; returns (secret, id)."""
        body = self.ok("POST", "/v1/tokens", {"name": name or unique_name(role), "role": role},
                       expect=201)
        return body["token"], body["id"]


class KeelTestCase(unittest.TestCase):
    """Prints the tail of every server's log when a test fails or errors.

    Subclasses list their servers in `servers()` (default: cls.server if set)."""

    maxDiff = 4000

    def servers(self):
        s = getattr(self, "server", None)
        return [s] if s is not None else []

    def run(self, result=None):
        before = None
        if result is not None:
            before = len(result.failures) + len(result.errors)
        out = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > before:
            for s in self.servers():
                try:
                    sys.stderr.write("\n%s: server log tail (home %s):\n%s\n"
                                     % (self.id(), s.home, s.log_tail(80)))
                except Exception:  # noqa: BLE001
                    pass
        return out

    # assertion helpers

    def assertStatus(self, resp, expected, what=""):
        status, body, _ = resp
        if isinstance(expected, int):
            expected = (expected,)
        self.assertIn(status, expected, "%s: got HTTP %s, body %r" % (what, status, body))
        return body

    def assertError(self, resp, status, code, what=""):
        """resp is (status, body, headers): checks the status and the JSON error shape."""
        st, body, _ = resp
        self.assertEqual(st, status, "%s: expected HTTP %s (%s), got %s: %r"
                         % (what, status, code, st, body))
        self.assertIsInstance(body, dict, "%s: error body is not JSON: %r" % (what, body))
        self.assertIn("error", body, "%s: no 'error' in %r" % (what, body))
        err = body["error"]
        self.assertIsInstance(err, dict, "%s: 'error' is not an object: %r" % (what, body))
        self.assertEqual(err.get("code"), code, "%s: error code in %r" % (what, body))
        self.assertIsInstance(err.get("message"), str, "%s: error message in %r" % (what, body))
        self.assertTrue(err["message"], "%s: empty error message" % what)
        return err

    def assertTime(self, value, what=""):
        self.assertIsInstance(value, str, "%s: time is not a string: %r" % (what, value))
        self.assertRegex(value, RFC3339_MS, "%s: not RFC 3339 UTC with milliseconds" % what)

    def assertHealthy(self, server=None):
        server = server or self.server
        status, body, _ = server.request("GET", "/healthz", token=None, timeout=10)
        self.assertEqual(status, 200, "server unhealthy: /healthz -> %s %r" % (status, body))
        self.assertTrue(server.alive(), "server process exited")
