"""A turn's SQLite statements build no temporary b-tree.

SQLite builds one (opcode OpenEphemeral) for an IN list of more than two constants wherever it
is evaluated, also in a partial index's WHERE at every write of the table, for an IN list that
drives an index key, and for IN (SELECT ...); making and dropping them took 11 % of a turn's
instructions (docs/ARCHITECTURE.md). This runs turns on a real server with a preloaded shim
that counts the runs of each prepared statement, then asks SQLite for the plan of every
statement that ran at least once a turn.
"""
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import unittest

from keel_harness import KeelServer

HERE = os.path.dirname(os.path.abspath(__file__))
TURNS = 30


def sanitized(binary):
    """A sanitizer's runtime must come first in the process; a preloaded shim would not let it."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return "libasan" in out or "libtsan" in out


class SqlitePlansTest(unittest.TestCase):
    def setUp(self):
        if os.environ.get("KEEL_TEST_STORE"):
            self.skipTest("SQLite plans")
        binary = os.environ.get("KEEL_BIN", "")
        if sanitized(binary):
            self.skipTest("a sanitizer build cannot take a preloaded library")
        compiler = shutil.which("cc") or shutil.which("gcc")
        if not compiler:
            self.skipTest("no C compiler for the shim")
        self.work = tempfile.mkdtemp(prefix="keel-it-plans-")
        self.shim = os.path.join(self.work, "sql_counts_shim.so")
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", self.shim,
                        os.path.join(HERE, "sql_counts_shim.c"), "-ldl", "-lpthread"], check=True)
        self.counts = os.path.join(self.work, "counts")

    def tearDown(self):
        if hasattr(self, "work"):
            shutil.rmtree(self.work, ignore_errors=True)

    def test_no_statement_a_turn_runs_builds_a_temporary_btree(self):
        server = KeelServer(env={"LD_PRELOAD": self.shim, "KEEL_SQL_COUNTS": self.counts})
        try:
            agent = server.create_agent()
            sessions = [server.create_session(agent["id"])["id"] for _ in range(2)]
            for i in range(TURNS):
                for session in sessions:
                    body = server.send(session, "turn %d" % i)
                    self.assertEqual(body["run"]["status"], "done", body)
            self.assertEqual(server.terminate(), 0)
            for suffix in ("", "-wal"):
                if os.path.exists(os.path.join(server.home, "keel.db" + suffix)):
                    shutil.copy(os.path.join(server.home, "keel.db" + suffix),
                                os.path.join(self.work, "keel.db" + suffix))
        finally:
            server.stop()
        copy = os.path.join(self.work, "keel.db")

        with open(self.counts, encoding="utf-8") as f:
            records = [r for r in f.read().split("\x1e") if r]
        runs = {}
        for record in records:
            count, sql = record.split("\t", 1)
            runs[sql] = runs.get(sql, 0) + int(count)
        # Every statement run at least once a turn, but transaction control.
        turn = sorted(sql for sql, n in runs.items() if n >= TURNS * len(sessions)
                      and not re.match(r"\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", sql, re.I))
        self.assertGreater(len(turn), 10, "the shim saw too few statements: %s" % turn)
        self.assertTrue(any(s.startswith("INSERT INTO events") for s in turn), turn)

        db = sqlite3.connect(copy, isolation_level=None)
        try:
            ephemeral = []
            for sql in turn:
                opcodes = [row[1] for row in self.explain(db, sql)]
                if "OpenEphemeral" in opcodes:
                    ephemeral.append(sql)
            self.assertEqual(ephemeral, [], "statements a turn runs build a temporary b-tree")
        finally:
            db.close()

    @staticmethod
    def explain(db, sql):
        """EXPLAIN with every parameter bound to NULL (the plan does not depend on the values)."""
        try:
            return db.execute("EXPLAIN " + sql).fetchall()
        except sqlite3.ProgrammingError as e:
            m = re.search(r"uses (\d+)", str(e))
            if not m:
                raise
            return db.execute("EXPLAIN " + sql, [None] * int(m.group(1))).fetchall()


if __name__ == "__main__":
    unittest.main()
