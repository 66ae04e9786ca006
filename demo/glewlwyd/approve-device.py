#!/usr/bin/env python3
"""Play the user approving a device sign-in (RFC 8628) at the test Glewlwyd.

  approve-device.py --issuer ISSUER --user-code CODE
                    [--username ada --password 'correct horse']

Signs in through Glewlwyd's login API (POST /api/auth/) and approves the user
code with GET /api/oidc/device?code=USER_CODE&g_continue, what the web app
does when the user confirms the code; the client's next poll of the token
endpoint then gets tokens. No consent step is needed (Glewlwyd does not ask
for one in the device flow). Glewlwyd has no way for the user to decline a
device code.

Prints one JSON object on stdout:
  {"approved": true|false, "status": HTTP status, "prompt": the outcome
   Glewlwyd redirects to (deviceComplete | deviceCodeError | deviceServerError
   | null), "location": the redirect}
Exit codes: 0 approved; 3 Glewlwyd refused the code (deviceCodeError: unknown,
expired or already used); 1 anything else; 2 bad usage.
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gwlib import Session, approve_device, die, sign_in  # noqa: E402

REFUSED = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--issuer", required=True)
    ap.add_argument("--user-code", required=True, help="the user_code from the device authorization response")
    ap.add_argument("--username", default="ada")
    ap.add_argument("--password", default="correct horse")
    args = ap.parse_args()
    if not args.user_code.strip():
        die("--user-code is empty", 2)

    s = Session()
    sign_in(s, args.issuer, args.username, args.password)
    approved, status, prompt, location = approve_device(s, args.issuer, args.user_code.strip())
    print(json.dumps({"approved": approved, "status": status, "prompt": prompt, "location": location}))
    if approved:
        sys.exit(0)
    if prompt == "deviceCodeError":
        print("refused: Glewlwyd did not accept user code %r (unknown, expired or already used)"
              % args.user_code, file=sys.stderr)
        sys.exit(REFUSED)
    die("approving user code %r answered HTTP %s, prompt=%s, location %s"
        % (args.user_code, status, prompt, location or "(none)"))


if __name__ == "__main__":
    main()
