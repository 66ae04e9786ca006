#!/usr/bin/env python3
"""Provision a freshly started Glewlwyd through its admin REST API.

Called by start.sh; can also be used on its own:

  provision.py --base http://127.0.0.1:PORT --key key.pem --cert cert.pem \
               [--access-token-seconds 3] [--refresh-token-seconds 1209600] \
               [--device-interval 1] [--dpop off|on|nonce:N] \
               [--registration off|open|token] [--par off|on|required]

  provision.py --base http://127.0.0.1:PORT add-redirect-uri CLIENT_ID URI...
      adds redirect URIs to an existing client (Glewlwyd matches redirect_uri
      exactly, port included, so a test that listens on another loopback port
      must register that exact URI first).

Prints nothing on success; exits non-zero with a message on stderr otherwise.
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gwlib import Session, die, parse_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

ADMIN = ("admin", "password")  # what Glewlwyd's shipped schema creates; loopback only

SCOPE = "openid offline_access profile email"

USER = {
    "username": "ada",
    "password": "correct horse",
    "email": "ada@example.org",
    "name": "Ada Lovelace",
}

# The fixed loopback redirect URIs every user-facing client accepts.
REDIRECT_URIS = [
    "http://127.0.0.1:53682/callback",
    "http://localhost:53682/callback",
    "http://[::1]:53682/callback",
]

PUBLIC_GRANTS = ["code", "refresh_token", "delete_token", "device_authorization"]
CONFIDENTIAL_GRANTS = [
    "code", "refresh_token", "delete_token", "device_authorization",
    "password", "client_credentials",
]

CLIENTS = [
    {"client_id": "public-app", "secret": None, "rotate": False, "grants": PUBLIC_GRANTS},
    {"client_id": "public-rotating", "secret": None, "rotate": True, "grants": PUBLIC_GRANTS},
    {"client_id": "confidential-app", "secret": "s3cret-confidential", "rotate": False,
     "grants": CONFIDENTIAL_GRANTS},
    {"client_id": "confidential-rotating", "secret": "s3cret-rotating", "rotate": True,
     "grants": CONFIDENTIAL_GRANTS},
]

# --registration token: registering needs an initial access token (RFC 7591
# section 3) carrying this scope; this confidential client gets one with
# client_credentials (start.sh writes both into DIR/env).
REGISTER_SCOPE = "register"
REGISTRAR = {"client_id": "registrar", "secret": "s3cret-registrar"}


class Admin:
    def __init__(self, base):
        self.base = base.rstrip("/")
        self.s = Session()

    def call(self, method, path, body=None, ok=(200,)):
        status, _, raw = self.s.request(method, self.base + "/api" + path, json_body=body)
        if status not in ok:
            die("admin API %s %s answered HTTP %s: %s"
                % (method, path, status, raw.decode(errors="replace")[:500]))
        return parse_json(raw)

    def login(self):
        self.call("POST", "/auth/", {"username": ADMIN[0], "password": ADMIN[1]})


def read(path):
    with open(path) as f:
        return f.read()


def plugin_parameters(args):
    with open(os.path.join(HERE, "oidc-plugin-defaults.json")) as f:
        p = json.load(f)
    p.update({
        "iss": args.base.rstrip("/") + "/api/oidc",
        "jwt-type": "rsa",
        "jwt-key-size": "256",
        "key": read(args.key),
        "cert": read(args.cert),
        "access-token-duration": args.access_token_seconds,
        "refresh-token-duration": args.refresh_token_seconds,
        "code-duration": 600,
        "refresh-token-rolling": True,
        # Per client: the client's "refresh-token-one-use" property decides.
        "refresh-token-one-use": "client-driven",
        "client-refresh-token-one-use-parameter": "refresh-token-one-use",
        "auth-type-code-enabled": True,
        "auth-type-token-enabled": True,
        "auth-type-id-token-enabled": True,
        "auth-type-none-enabled": True,
        "auth-type-password-enabled": True,
        "auth-type-client-enabled": True,
        "auth-type-device-enabled": True,
        "auth-type-refresh-enabled": True,
        "pkce-allowed": True,
        "pkce-method-plain-allowed": False,
        "pkce-required": True,
        "introspection-revocation-allowed": True,
        "introspection-revocation-allow-target-client": True,
        "session-management-allowed": True,
        "allowed-scope": SCOPE.split(),
        "jwks-show": True,
        "device-authorization-interval": args.device_interval,
        # Without this Glewlwyd answers 403 to the password and
        # client_credentials grants ("grant_type password unauthorized").
        "allow-non-oidc": True,
        "name-claim": "mandatory",
        "email-claim": "mandatory",
    })
    if args.dpop != "off":
        # RFC 9449: discovery then lists dpop_signing_alg_values_supported.
        p["oauth-dpop-allowed"] = True
        p["oauth-dpop-iat-duration"] = 60
        if args.dpop.startswith("nonce:"):
            p["oauth-dpop-nonce-mandatory"] = True
            p["oauth-dpop-nonce-counter"] = int(args.dpop.split(":", 1)[1])
    if args.registration != "off":
        # RFC 7591 at ISSUER/register (discovery then lists
        # registration_endpoint) and RFC 7592 management, so the reply carries
        # registration_client_uri and registration_access_token.
        p["register-client-allowed"] = True
        p["register-client-management-allowed"] = True
        if args.registration == "open":
            p["register-client-auth-scope"] = []
        else:
            # Only a bearer token with this scope may register, each token once.
            p["register-client-auth-scope"] = [REGISTER_SCOPE]
            p["register-client-token-one-use"] = True
            # The registrar's client_credentials request for the scope is
            # refused unless the plugin allows it.
            p["allowed-scope"] = p["allowed-scope"] + [REGISTER_SCOPE]
    if args.par != "off":
        # RFC 9126 at ISSUER/par: discovery then lists
        # pushed_authorization_request_endpoint and
        # require_pushed_authorization_requests. Per plugin instance, not per
        # client: with oauth-par-required every client of this issuer must push.
        p["oauth-par-allowed"] = True
        # Must be non-empty.
        p["oauth-par-request_uri-prefix"] = "urn:ietf:params:oauth:request_uri:"
        p["oauth-par-duration"] = 90
        p["oauth-par-required"] = args.par == "required"
    return p


def provision(args):
    a = Admin(args.base)
    a.login()

    # 1. Let the client backend store the per-client rotation flag.
    mod = a.call("GET", "/mod/client/database")
    params = mod.get("parameters") or {}
    fmt = params.setdefault("data-format", {})
    fmt["refresh-token-one-use"] = {"multiple": False, "read": True, "write": True}
    mod["parameters"] = params
    a.call("PUT", "/mod/client/database", mod)
    a.call("PUT", "/mod/client/database/reset")

    # 2. Scopes (openid ships with the schema).
    scopes = [("offline_access", "Offline access"), ("profile", "Profile"), ("email", "E-mail address")]
    if args.registration == "token":
        scopes.append((REGISTER_SCOPE, "Register clients (RFC 7591 initial access token)"))
    for name, desc in scopes:
        a.call("POST", "/scope/", {
            "name": name, "display_name": desc, "description": desc,
            "password_required": False, "scheme": {},
        })

    # 3. The OIDC plugin.
    a.call("POST", "/mod/plugin/", {
        "module": "oidc", "name": "oidc", "display_name": "OpenID Connect",
        "enabled": True, "parameters": plugin_parameters(args),
    })
    a.call("PUT", "/mod/plugin/oidc/reset")

    # 4. The user.
    a.call("POST", "/user/", {
        "username": USER["username"], "password": USER["password"],
        "email": USER["email"], "name": USER["name"], "enabled": True,
        "scope": SCOPE.split() + ["g_profile"],
    })

    # 5. Clients.
    for c in CLIENTS:
        body = {
            "client_id": c["client_id"],
            "name": c["client_id"],
            "description": "tokenvault test client",
            "enabled": True,
            "confidential": c["secret"] is not None,
            "redirect_uri": list(REDIRECT_URIS),
            "authorization_type": list(c["grants"]),
            "scope": SCOPE.split(),
            "refresh-token-one-use": "1" if c["rotate"] else "0",
        }
        if c["secret"] is not None:
            body["password"] = c["secret"]
            body["client_secret"] = c["secret"]
            body["token_endpoint_auth_method"] = ["client_secret_basic", "client_secret_post"]
        else:
            body["token_endpoint_auth_method"] = ["none"]
        a.call("POST", "/client/", body)
        got = a.call("GET", "/client/" + c["client_id"])
        want = "1" if c["rotate"] else "0"
        if got.get("refresh-token-one-use") != want:
            die("client %s: refresh-token-one-use stored as %r, wanted %r"
                % (c["client_id"], got.get("refresh-token-one-use"), want))

    # 6. The registrar (--registration token). Without client_secret and
    #    token_endpoint_auth_method Glewlwyd answers its client_credentials
    #    request with 403 and an empty body.
    if args.registration == "token":
        a.call("POST", "/client/", {
            "client_id": REGISTRAR["client_id"],
            "name": REGISTRAR["client_id"],
            "description": "gets initial access tokens for dynamic client registration",
            "enabled": True,
            "confidential": True,
            "password": REGISTRAR["secret"],
            "client_secret": REGISTRAR["secret"],
            "token_endpoint_auth_method": ["client_secret_basic", "client_secret_post"],
            "redirect_uri": [],
            "authorization_type": ["client_credentials"],
            "scope": [REGISTER_SCOPE],
        })


def add_redirect_uri(args):
    a = Admin(args.base)
    a.login()
    client = a.call("GET", "/client/" + args.client_id)
    uris = client.get("redirect_uri") or []
    if isinstance(uris, str):
        uris = [uris]
    for u in args.uri:
        if u not in uris:
            uris.append(u)
    client["redirect_uri"] = uris
    for k in ("source", "client_id"):
        client.pop(k, None)
    a.call("PUT", "/client/" + args.client_id, client)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--key")
    ap.add_argument("--cert")
    ap.add_argument("--access-token-seconds", type=int, default=3)
    ap.add_argument("--refresh-token-seconds", type=int, default=1209600)
    ap.add_argument("--device-interval", type=int, default=1)
    ap.add_argument("--dpop", default="off", help="off, on, or nonce:N")
    ap.add_argument("--registration", choices=("off", "open", "token"), default="off",
                    help="dynamic client registration (RFC 7591/7592): off, open (no initial "
                         "access token), or token (needs one with scope register)")
    ap.add_argument("--par", choices=("off", "on", "required"), default="off",
                    help="pushed authorization requests (RFC 9126): off, on (allowed at "
                         "ISSUER/par), or required (a plain /auth request is refused)")
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("add-redirect-uri")
    r.add_argument("client_id")
    r.add_argument("uri", nargs="+")
    args = ap.parse_args()
    if args.cmd == "add-redirect-uri":
        add_redirect_uri(args)
    else:
        if not args.key or not args.cert:
            die("--key and --cert are required to provision")
        provision(args)


if __name__ == "__main__":
    main()
