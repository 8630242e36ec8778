"""The dashboard driven in a real headless Chromium (tests/browser/dashboard.mjs): sign in, create
an agent, chat and watch the answer stream, markup shown as text, an approval amended in the
inbox while a second browser watches, runs and a scheduled run arriving live, the event log, a
Telegram channel's dead reply on the channels page (tests/fakes/fake_telegram.py), a phone's
width, sign-out; axe-core on each page and no console errors. Screenshots of the main
pages go to the build directory's dashboard-screenshots/ (or KEEL_TEST_SCREENSHOTS)."""

import os
import shutil
import subprocess
import sys
import unittest

from keel_harness import FakeOpenAi, KeelServer, KeelTestCase, Tenant, keel_bin

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "browser", "dashboard.mjs")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
KEK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="


class DashboardBrowserTest(KeelTestCase):
    @classmethod
    def setUpClass(cls):
        cls.web_dir = os.path.join(os.path.dirname(os.path.abspath(keel_bin())), "web")
        cls.fake = FakeOpenAi()
        # Secrets (a bot's token) and the fake Telegram on 127.0.0.1 as an outbound target.
        cls.server = KeelServer(env=dict(cls.fake.env, KEEL_SECRET_KEK=KEK,
                                         KEEL_OUTBOUND_ALLOW="127.0.0.1/32"))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.fake.stop()

    def test_the_dashboard_in_a_browser(self):
        for need in (CHROMIUM, os.path.join(self.web_dir, "node_modules", "playwright-core")):
            self.assertTrue(os.path.exists(need),
                            "%s is missing: scripts/install-deps.sh installs Chromium, the build "
                            "installs playwright-core" % need)
        tenant = Tenant(self.server)
        shots = os.environ.get("KEEL_TEST_SCREENSHOTS") or os.path.join(
            os.path.dirname(self.web_dir), "dashboard-screenshots")
        shutil.rmtree(shots, ignore_errors=True)
        env = dict(os.environ, KEEL_URL=self.server.base_url, KEEL_TOKEN=tenant.token,
                   KEEL_ADMIN_TOKEN=self.server.token,
                   KEEL_SLOW_MODEL="openai/slow-words", KEEL_WEB_DIR=self.web_dir,
                   KEEL_SCREENSHOTS=shots, CHROMIUM=CHROMIUM, KEEL_PYTHON=sys.executable)
        proc = subprocess.run(["node", SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        sys.stderr.write(proc.stdout)
        self.assertEqual(proc.returncode, 0, proc.stdout[-4000:])
        self.assertIn("ok - no console errors on any page", proc.stdout)


if __name__ == "__main__":
    unittest.main()
