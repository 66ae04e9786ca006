#!/usr/bin/env python3
"""RFC 7662 introspection (or, with --revoke, RFC 7009 revocation) against the test Glewlwyd.

  echo "$TOKEN" | introspect.py --issuer URL --client-id ID --client-secret S \
                                [--hint access_token|refresh_token]

Reads the token from stdin, authenticates the client with HTTP Basic (the only
method Glewlwyd advertises for introspection), prints the introspection JSON
(at least {"active": true|false}) on stdout. Exit 0 when the endpoint answered
200 (whatever "active" says), 1 otherwise.
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gwlib import Session, die, discovery, parse_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--issuer", required=True)
    ap.add_argument("--client-id", required=True)
    ap.add_argument("--client-secret", required=True)
    ap.add_argument("--hint", choices=("access_token", "refresh_token"))
    ap.add_argument("--revoke", action="store_true", help="revoke the token (RFC 7009) instead of introspecting it")
    args = ap.parse_args()
    token = sys.stdin.read().strip()
    if not token:
        die("no token on stdin", 2)
    s = Session()
    disco = discovery(args.issuer, s)
    endpoint = disco.get("revocation_endpoint" if args.revoke else "introspection_endpoint")
    if not endpoint:
        die("discovery has no %s endpoint" % ("revocation" if args.revoke else "introspection"))
    form = {"token": token}
    if args.hint:
        form["token_type_hint"] = args.hint
    status, _, body = s.request("POST", endpoint, form=form, basic=(args.client_id, args.client_secret))
    if args.revoke:
        if status != 200:
            die("revocation answered HTTP %s" % status)
        print(json.dumps({"revoked": True}))
        return
    doc = parse_json(body)
    if status != 200 or not isinstance(doc, dict):
        die("introspection answered HTTP %s %s" % (status, body.decode(errors="replace")[:300] or "(empty body)"))
    print(json.dumps(doc, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
