"""Secrets over HTTP and the CLI: set, list (names only), delete; values never come back, never
reach an event, the database, the log or an export archive; without a valid KEEL_SECRET_KEK every
sealing operation fails closed with a message naming the variable."""

import base64
import os
import subprocess
import tempfile
import unittest

from keel_harness import KeelServer, KeelTestCase, keel_bin

KEK = base64.b64encode(bytes(range(32))).decode()
VALUES = ["sk-live-4f9c2a7e1b3d5f60", "ghp_secretvalue0123456789", "p@ss w0rd|with odd chars"]


class SecretsTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KeelServer(env={"KEEL_SECRET_KEK": KEK})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def put(self, name, value, **kw):
        return self.server.request("PUT", "/v1/secrets/" + name, {"value": value}, **kw)

    def test_set_list_replace_delete(self):
        s = self.server
        for i, v in enumerate(VALUES):
            status, body, _ = self.put("lifecycle_%d" % i, v)
            self.assertEqual(status, 204, body)
        status, body, _ = s.request("GET", "/v1/secrets")
        self.assertEqual(status, 200)
        mine = [x for x in body["items"] if x["name"].startswith("lifecycle_")]
        self.assertEqual([x["name"] for x in mine], ["lifecycle_0", "lifecycle_1", "lifecycle_2"])
        for x in mine:
            self.assertEqual(sorted(x), ["created_at", "name", "updated_at"])
            self.assertTime(x["created_at"])
        first = mine[0]
        status, _, _ = self.put("lifecycle_0", "replaced-value-xyz")
        self.assertEqual(status, 204)
        again = [x for x in s.request("GET", "/v1/secrets")[1]["items"]
                 if x["name"] == "lifecycle_0"][0]
        self.assertEqual(again["created_at"], first["created_at"])
        self.assertGreaterEqual(again["updated_at"], first["updated_at"])
        status, _, _ = s.request("DELETE", "/v1/secrets/lifecycle_1")
        self.assertEqual(status, 204)
        resp = s.request("DELETE", "/v1/secrets/lifecycle_1")
        self.assertError(resp, 404, "not_found")
        names = [x["name"] for x in s.request("GET", "/v1/secrets")[1]["items"]]
        self.assertNotIn("lifecycle_1", names)
        # Events name the secret, never the value.
        events = [e for e in s.all_events() if e["type"].startswith("secret.")]
        self.assertIn({"name": "lifecycle_0", "created": True},
                      [e["payload"] for e in events if e["type"] == "secret.set@v1"])
        self.assertIn({"name": "lifecycle_1"},
                      [e["payload"] for e in events if e["type"] == "secret.deleted@v1"])

    def test_bad_requests(self):
        s = self.server
        self.assertError(self.put("bad%20name", "v"), 400, "invalid_argument")
        self.assertError(self.put("x" * 129, "v"), 400, "invalid_argument")
        self.assertError(s.request("PUT", "/v1/secrets/ok", {"value": 5}), 400, "invalid_argument")
        self.assertError(s.request("PUT", "/v1/secrets/ok", {"value": "v", "extra": 1}), 400,
                         "invalid_argument")
        self.assertError(self.put("huge", "x" * (64 * 1024 + 1)), 400, "invalid_argument")
        # Only owners manage secrets.
        status, tok, _ = s.request("POST", "/v1/tokens", {"name": "u", "role": "user"})
        self.assertEqual(status, 201)
        for method, path, body in (("PUT", "/v1/secrets/x", {"value": "v"}),
                                   ("GET", "/v1/secrets", None),
                                   ("DELETE", "/v1/secrets/x", None)):
            self.assertError(s.request(method, path, body, token=tok["token"]), 403,
                             "permission_denied")

    def test_no_plaintext_at_rest_in_the_log_or_in_an_export(self):
        s = self.server
        for i, v in enumerate(VALUES):
            self.assertEqual(self.put("rest_%d" % i, v)[0], 204)
        blobs = list(s.store_contents())
        with open(s.stderr_path, "rb") as f:
            blobs.append(("server log", f.read()))
        with tempfile.TemporaryDirectory() as d:
            archive = os.path.join(d, "export.tar.zst")
            proc = subprocess.run([keel_bin(), "export", "--home", s.home, "--store",
                                   s.store_url or "sqlite://" + os.path.join(s.home, "keel.db"),
                                   archive], capture_output=True, text=True, timeout=120)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            tar = subprocess.run(["tar", "--zstd", "-xOf", archive], capture_output=True,
                                 timeout=60)
            self.assertEqual(tar.returncode, 0, tar.stderr)
            blobs.append(("export archive contents", tar.stdout))
            self.assertIn(b'"name":"rest_0"', tar.stdout, "the export carries the secrets")
        for label, data in blobs:
            for v in VALUES:
                self.assertNotIn(v.encode(), data, "%s holds the plaintext %r" % (label, v))

    def test_cli_reads_the_value_from_stdin(self):
        s = self.server
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update({"KEEL_URL": s.base_url, "KEEL_TOKEN": s.token})
        proc = subprocess.run([keel_bin(), "secrets", "set", "from_cli"], input="cli-value-1\n",
                              capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip(), "set secret from_cli")
        listed = subprocess.run([keel_bin(), "secrets", "list"], capture_output=True, text=True,
                                env=env, timeout=30)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn("from_cli", listed.stdout)
        self.assertNotIn("cli-value-1", listed.stdout)
        gone = subprocess.run([keel_bin(), "secrets", "rm", "from_cli"], capture_output=True,
                              text=True, env=env, timeout=30)
        self.assertEqual(gone.returncode, 0, gone.stderr)
        missing = subprocess.run([keel_bin(), "secrets", "rm", "from_cli"], capture_output=True,
                                 text=True, env=env, timeout=30)
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn("secret not found: from_cli", missing.stderr)


class SecretsWithoutAKeyTest(KeelTestCase):
    """No KEEL_SECRET_KEK, or a malformed one: the server runs; sealing fails closed."""

    def check(self, env, expect):
        server = KeelServer(env=env)
        self.addCleanup(server.stop)
        resp = server.request("PUT", "/v1/secrets/x", {"value": "v"})
        self.assertError(resp, 503, "unavailable")
        self.assertIn(expect, resp[1]["error"]["message"])
        self.assertEqual(server.request("GET", "/v1/secrets")[1]["items"], [])
        self.assertHealthy(server)
        with open(server.stderr_path) as f:
            self.assertIn("secrets are disabled", f.read())

    def test_missing_key(self):
        self.check({}, "KEEL_SECRET_KEK is not set")

    def test_malformed_key(self):
        self.check({"KEEL_SECRET_KEK": base64.b64encode(b"sixteen byte key").decode()},
                   "decodes to 16 bytes")


if __name__ == "__main__":
    unittest.main()
