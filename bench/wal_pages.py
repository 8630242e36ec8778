#!/usr/bin/env python3
"""The pages each SQLite commit wrote, by table and index, read from a store's WAL.

    python3 bench/wal_pages.py KEEL_HOME/keel.db [--top N]

Run it on the store of a server stopped with kill -9 under load (so the WAL was not checkpointed
away), for example `keel serve` with `keel_loadgen --concurrency 64` against it. Every page a
commit changed is written whole to the WAL, so the pages per commit, and which b-trees they
belong to, say where a turn's writes go: a table or index whose page a turn touches at a place of
its own (keyed by session, or by a hash) costs a page per turn, one that grows at its end shares
its page with the other turns of the commit. Pages the main file does not have yet (a table
growing) show as "(new)".
"""

import argparse
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile


def frames_of(wal_path):
    """(page number, commit size) of each valid frame of the WAL's current generation."""
    data = open(wal_path, "rb").read()
    if len(data) < 32:
        return []
    _, _, page_size, _, salt1, salt2, _, _ = struct.unpack(">IIIIIIII", data[:32])
    frames, off = [], 32
    while off + 24 + page_size <= len(data):
        page, commit, s1, s2, _, _ = struct.unpack(">IIIIII", data[off:off + 24])
        if (s1, s2) != (salt1, salt2):
            break
        frames.append((page, commit))
        off += 24 + page_size
    return frames


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    wal = a.db + "-wal"
    if not os.path.exists(wal):
        sys.exit(f"wal_pages: {wal} does not exist (was the server stopped cleanly?)")
    frames = frames_of(wal)
    commits = sum(1 for _, c in frames if c)
    if not commits:
        sys.exit("wal_pages: the WAL holds no commit")
    # dbstat over a copy of the main file alone: the owner of each page before the WAL.
    with tempfile.TemporaryDirectory() as d:
        copy = os.path.join(d, "main.db")
        shutil.copy(a.db, copy)
        con = sqlite3.connect(copy)
        owner = {pg: name for name, pg in con.execute("SELECT name, pageno FROM dbstat")}
        con.close()
    by = collections.Counter(owner.get(p, "(new)") for p, _ in frames)
    print(f"{len(frames)} frames, {commits} commits: {len(frames) / commits:.1f} pages a commit")
    for name, n in by.most_common(a.top):
        print(f"  {n / commits:7.1f}  {name}")


if __name__ == "__main__":
    main()
