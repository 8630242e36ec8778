"""The README's five-minute tour runs as written, in order, and prints what it shows.

Every ```console block of the tour section is a script: `$ ` lines are commands (a line ending
in a backslash continues, a heredoc runs to its end marker), the lines after a command are the
output it must print. All commands run in one bash shell, in a fresh directory that holds
`build/keel` (this build's binary) and the repository's `tests/` and `scripts/`, so every
variable a command uses must have been set by an earlier line, as for a new user.

Output is compared loosely where it must be: ids, tokens, times, temporary paths and numbers
of milliseconds differ from run to run and are normalized on both sides; runs of spaces are
one space (table columns widen with the data); `...` in the README stands for any text. Each
line the README shows must appear in the command's output, in order. A command whose shown
output does not start with `keel:` (a notice) must exit 0.

KEEL_TOUR_PRINT=1 prints every command with its output, for writing the README.

The tour's port 7878 is replaced by a free port (in the commands, and as KEEL_LISTEN for the
server) so that the test can run beside other servers.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from keel_harness import SKIP_EXIT_CODE, keel_bin

if os.environ.get("KEEL_TEST_STORE"):
    # The tour runs on the default store of its own KEEL_HOME; once is enough.
    sys.stderr.write("SKIPPED: the README tour runs on its own SQLite store only\n")
    sys.exit(SKIP_EXIT_CODE)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
README = os.path.join(REPO, "README.md")
SENTINEL = "__keel_tour_done__"

NORMALIZE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"introspection-[0-9a-f]{16}"), "<id>"),
    (re.compile(r"keel_[A-Za-z0-9_-]{20,}"), "<token>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "<time>"),
    (re.compile(r"/tmp/tmp\.[A-Za-z0-9]+"), "<tmp>"),
    (re.compile(r"/tmp/[A-Za-z0-9_.-]*keel-tour[A-Za-z0-9_.-]*"), "<tmp>"),
    (re.compile(r'"elapsed_ms":\d+'), '"elapsed_ms":<n>'),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"localhost:\d+"), "localhost:<port>"),
]


def normalize(line):
    for pattern, repl in NORMALIZE:
        line = pattern.sub(repl, line)
    return " ".join(line.split())


def line_pattern(expected):
    """A regex for one shown line: `...` matches anything, the rest literally."""
    parts = [re.escape(p) for p in normalize(expected).split("...")]
    return re.compile("^" + ".*".join(parts) + "$")


class Command:
    def __init__(self, text, expected, block_line):
        self.text = text
        self.expected = expected
        self.block_line = block_line


def tour_commands(readme_text):
    """The commands of the tour's console blocks, with the output each shows."""
    lines = readme_text.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("## A five-minute tour"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    commands = []
    i = start
    while i < end:
        if lines[i].strip() != "```console":
            i += 1
            continue
        i += 1
        block = []
        while lines[i].strip() != "```":
            block.append((i + 1, lines[i]))
            i += 1
        i += 1
        j = 0
        while j < len(block):
            lineno, line = block[j]
            if not line.startswith("$ "):
                raise AssertionError(f"README.md:{lineno}: output before any command: {line!r}")
            text = line[2:]
            j += 1
            heredoc = re.search(r"<<-?\s*'?(\w+)'?", text)
            while text.endswith("\\") and j < len(block):
                text = text + "\n" + block[j][1]
                j += 1
            if heredoc:
                marker = heredoc.group(1)
                while j < len(block):
                    text += "\n" + block[j][1]
                    j += 1
                    if block[j - 1][1] == marker:
                        break
            expected = []
            while j < len(block) and not block[j][1].startswith("$ "):
                if block[j][1].strip():
                    expected.append(block[j][1])
                j += 1
            commands.append(Command(text, expected, lineno))
    return commands


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReadmeTourTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="keel-tour-")
        os.makedirs(os.path.join(self.dir, "build"))
        os.symlink(os.path.abspath(keel_bin()), os.path.join(self.dir, "build", "keel"))
        for name in ("tests", "scripts"):
            os.symlink(os.path.join(REPO, name), os.path.join(self.dir, name))
        self.port = str(free_port())
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["HOME"] = self.dir
        env["KEEL_LISTEN"] = "127.0.0.1:" + self.port  # the tour's 7878, moved (see above)
        self.shell = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=self.dir, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True)
        self.server_logs = []

    def tearDown(self):
        try:
            self.run_in_shell('kill $(jobs -p) 2>/dev/null; wait', timeout=20)
        except Exception:
            pass
        try:
            os.killpg(self.shell.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.shell.wait()
        if os.environ.get("KEEL_TEST_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def run_in_shell(self, script, timeout=120):
        """Runs `script` in the tour's shell (stdin from /dev/null); returns (output, status)."""
        path = os.path.join(self.dir, ".tour-command.sh")
        with open(path, "w") as f:
            f.write(script + "\n")
        self.shell.stdin.write(f"source {path} </dev/null; echo \"{SENTINEL}$?\"\n")
        self.shell.stdin.flush()
        out = []
        deadline = time.time() + timeout
        while True:
            if time.time() > deadline:
                raise AssertionError(f"timed out after {timeout}s running:\n{script}")
            line = self.shell.stdout.readline()
            if line == "":
                raise AssertionError(f"the shell ended while running:\n{script}\n{''.join(out)}")
            if line.startswith(SENTINEL):
                return "".join(out), int(line[len(SENTINEL):].strip())
            if SENTINEL in line:  # output without a final newline
                before, status = line.split(SENTINEL, 1)
                out.append(before + "\n")
                return "".join(out), int(status.strip())
            out.append(line)

    def wait_for_server(self, log_path):
        home, _ = self.run_in_shell('printf %s "$KEEL_HOME"')
        addr = os.path.join(home.strip(), "listen.addr")
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(addr):
                return
            time.sleep(0.05)
        with open(log_path) as f:
            raise AssertionError("the tour's server did not start:\n" + f.read())

    def check_output(self, command, output, status):
        """The problem with a command's output and status, or None."""
        where = f"README.md:{command.block_line}: $ {command.text}"
        actual = [normalize(l) for l in output.split("\n") if l.strip()]
        pos = 0
        for shown in command.expected:
            pattern = line_pattern(shown)
            while pos < len(actual) and not pattern.match(actual[pos]):
                pos += 1
            if pos == len(actual):
                return (f"{where}\nshows the line\n  {shown}\nwhich its output lacks "
                        f"(in order); the output was (exit {status}):\n{output}")
            pos += 1
        notice = bool(command.expected) and command.expected[0].startswith("keel:")
        if not notice and status != 0:
            return f"{where}\nexited {status}; output:\n{output}"
        return None

    def test_tour_runs_as_written(self):
        with open(README) as f:
            commands = tour_commands(f.read())
        self.assertGreater(len(commands), 20)
        problems = []
        for n, command in enumerate(commands):
            text = command.text.replace("7878", self.port)
            background = text.rstrip().endswith("&")
            if background:
                log_path = os.path.join(self.dir, f".tour-server-{n}.log")
                text = text.rstrip()[:-1] + f" >{log_path} 2>&1 &"
            output, status = self.run_in_shell(text)
            if background:
                self.wait_for_server(log_path)
                time.sleep(0.3)  # the banner is written before listen.addr, the log line after
                with open(log_path) as f:
                    output += f.read()
            if os.environ.get("KEEL_TOUR_PRINT") == "1":  # to write the README's output
                sys.stderr.write(f"$ {command.text}\n{output}[exit {status}]\n")
            problem = self.check_output(command, output, status)
            if problem:
                problems.append(problem)
        # Every mismatch at once (later commands may fail only because an earlier one did).
        self.assertFalse(problems, "\n\n".join(problems))


if __name__ == "__main__":
    unittest.main()
