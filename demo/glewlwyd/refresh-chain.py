#!/usr/bin/env python3
"""Where a refresh token stands in its rotation chain, read from the test
Glewlwyd's database (no HTTP, so asking changes nothing at the provider).

  refresh-chain.py DIR < refresh-token        (DIR: the folder start.sh made)
  refresh-chain.py DIR --hash '{SHA512}...'    (the hash the database keeps)

Glewlwyd keeps every refresh token it issued as one row of gpo_refresh_token,
by hash ('{SHA512}' + base64 of SHA-512 of the token). A rotating client's
chain shares one gpor_jti: each refresh disables the token it was given and
adds a row for its successor; presenting a disabled one disables the whole
chain. So for a token a client holds:

  known false                     the provider never issued it
  enabled true, successors 0      the newest of its chain: it still refreshes
  enabled false, successors 1     it was spent: the provider answered one
                                  refresh of it, and that answer (the
                                  successor) is the only live continuation
  chain_enabled 0                 the chain is dead (replay or revocation)

Ask while no client is refreshing (e.g. after the client has stopped or
been refused): Glewlwyd's own SQLite queries fail, and it answers HTTP 500,
when a reader holds the database the instant it writes.

Prints one JSON object: {"known", "enabled", "successors", "successor_id"
(its row in gpo_refresh_token), "successor_enabled", "chain_enabled",
"chain_length"}; never a token. The
token is read from the first line of stdin. Exit 0 when the database could be
read (whatever the answer), 1 otherwise, 2 usage.
"""

import argparse
import base64
import hashlib
import json
import os
import sqlite3
import sys

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__


def token_hash(token):
    """The hash Glewlwyd stores for a token (hash_algorithm SHA512)."""
    digest = hashlib.sha512(token.encode()).digest()
    return "{SHA512}" + base64.b64encode(digest).decode()


def chain_position(db_path, stored_hash):
    """The chain facts for the token whose database hash is stored_hash."""
    db = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True, timeout=10)
    try:
        row = db.execute(
            "SELECT gpor_id, gpor_jti, gpor_enabled FROM gpo_refresh_token WHERE gpor_token_hash = ?",
            (stored_hash,),
        ).fetchone()
        if row is None:
            return {"known": False, "enabled": False, "successors": 0, "successor_id": None,
                    "successor_enabled": None, "chain_enabled": 0, "chain_length": 0}
        ident, jti, enabled = row
        chain = db.execute(
            "SELECT gpor_id, gpor_enabled FROM gpo_refresh_token WHERE gpor_jti = ? ORDER BY gpor_id",
            (jti,),
        ).fetchall()
    finally:
        db.close()
    after = [r for r in chain if r[0] > ident]
    return {
        "known": True,
        "enabled": bool(enabled),
        "successors": len(after),
        "successor_id": after[0][0] if after else None,
        "successor_enabled": bool(after[0][1]) if after else None,
        "chain_enabled": sum(1 for r in chain if r[1]),
        "chain_length": len(chain),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the folder demo/glewlwyd/start.sh made")
    ap.add_argument("--hash", help="the stored hash instead of the token on stdin")
    args = ap.parse_args()
    if args.hash:
        stored = args.hash
    else:
        token = sys.stdin.readline().strip()
        if not token:
            print("refresh-chain.py: no token on stdin", file=sys.stderr)
            sys.exit(2)
        stored = token_hash(token)
    db_path = os.path.join(args.dir, "glewlwyd.db")
    if not os.path.exists(db_path):
        print("refresh-chain.py: %s does not exist" % db_path, file=sys.stderr)
        sys.exit(1)
    try:
        facts = chain_position(db_path, stored)
    except sqlite3.Error as e:
        print("refresh-chain.py: cannot read %s: %s" % (db_path, e), file=sys.stderr)
        sys.exit(1)
    print(json.dumps(facts, sort_keys=True))


if __name__ == "__main__":
    main()
