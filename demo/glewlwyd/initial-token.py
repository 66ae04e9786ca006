#!/usr/bin/env python3
"""Print a fresh initial access token for dynamic client registration.

  initial-token.py DIR        (DIR: the folder start.sh made with
                               GLEWLWYD_REGISTRATION=token)

POSTs ISSUER/token grant_type=client_credentials&scope=register with HTTP
Basic as the registrar client named in DIR/env (GLEWLWYD_REGISTRAR_CLIENT_ID,
GLEWLWYD_REGISTRAR_SECRET) and prints the access token, alone on one line.
Send it as "Authorization: Bearer TOKEN" to ISSUER/register; each token
registers one client (register-client-token-one-use), so ask again for the
next registration.

Exit codes: 0 token printed; 1 failure (message on stderr); 2 bad usage.
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gwlib import die, initial_access_token, load_env  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", metavar="DIR", help="the folder start.sh made")
    args = ap.parse_args()
    env = load_env(args.dir)
    if env.get("GLEWLWYD_REGISTRATION") != "token" or not env.get("GLEWLWYD_REGISTRAR_CLIENT_ID"):
        die("%s was not started with GLEWLWYD_REGISTRATION=token (its env has GLEWLWYD_REGISTRATION=%r); "
            "there is no registrar client" % (args.dir, env.get("GLEWLWYD_REGISTRATION")))
    print(initial_access_token(env["GLEWLWYD_ISSUER"], env["GLEWLWYD_REGISTRAR_CLIENT_ID"],
                               env["GLEWLWYD_REGISTRAR_SECRET"]))


if __name__ == "__main__":
    main()
