"""The soak's short form (tests/integration/soak.py; scripts/soak.sh runs the long one): kill -9
at random under turns with notes.append and exec, approvals and one-shot schedules, on one SQLite
node (integration.test_soak) or three nodes on PostgreSQL (integration_pg.test_soak), and nothing
acknowledged is lost, no once-effect happens twice, and the invariants of turn_load hold.

Environment: KEEL_SOAK_KILLS (default 20), KEEL_SOAK_SEED (default: random; printed).
"""

import os
import random
import sys
import unittest

from keel_harness import KeelTestCase
from soak import run

KILLS = int(os.environ.get("KEEL_SOAK_KILLS", "20"))
SEED = int(os.environ.get("KEEL_SOAK_SEED", str(random.randrange(1 << 30))))


class SoakTest(KeelTestCase):
    def test_kill9_under_a_mixed_load_loses_and_repeats_nothing(self):
        backend = "postgres" if os.environ.get("KEEL_TEST_STORE") == "postgres" else "sqlite"
        ok, line = run(backend, KILLS, SEED)
        sys.stderr.write("\n%s (KEEL_SOAK_SEED=%d)\n" % (line, SEED))
        self.assertTrue(ok, "%s (KEEL_SOAK_SEED=%d; the lines above say what failed)"
                        % (line, SEED))


if __name__ == "__main__":
    unittest.main()
