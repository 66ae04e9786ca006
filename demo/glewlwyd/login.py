#!/usr/bin/env python3
"""Headless sign-in against the test Glewlwyd: plays the browser, prints tokens.

  login.py --issuer URL --client-id ID [--client-secret S]
           [--scope "openid offline_access profile email"]
           --username ada --password 'correct horse'
           [--redirect-uri http://127.0.0.1:53682/callback]
           [--grant code|password|device] [--client-auth basic|post]
           [--verifier-mismatch]

--grant code (default): authorization code + PKCE S256. Signs in through
  Glewlwyd's login API (POST /api/auth/), grants consent
  (PUT /api/auth/grant/CLIENT), calls the authorization endpoint with the
  session cookie and g_continue, takes the code from the 302 Location and
  redeems it with the code_verifier.
--grant password: resource-owner password grant (confidential clients only;
  Glewlwyd refuses it without client authentication).
--grant device: device authorization grant (RFC 8628); approves the user code
  through GET /api/oidc/device?code=...&g_continue with the session cookie,
  then polls the token endpoint.
--verifier-mismatch: with --grant code, redeem the code with a different,
  well-formed verifier; the server must refuse it.

Client authentication: with --client-secret, HTTP Basic (default) or the form
body (--client-auth post); without one, client_id goes in the form body (a
public client sending Basic with an empty secret is refused).

On success prints the token endpoint's JSON response (refresh_token,
access_token, id_token, expires_in, token_type, scope, iat) on stdout.
Exit codes: 0 tokens obtained; 1 any other failure; 2 bad usage;
3 the token endpoint refused the grant (what --verifier-mismatch expects).
"""

import argparse
import json
import os
import sys
import time
import urllib.parse

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gwlib import (Session, approve_device, authorize, die, discovery, grant_consent,  # noqa: E402
                   parse_json, pkce_pair, query_params, random_string, same_endpoint, sign_in)

REFUSED = 3


def client_auth(args, form):
    """Returns the basic= argument for Session.request and fills form as needed."""
    if args.client_secret is None:
        form["client_id"] = args.client_id
        return None
    if args.client_auth == "post":
        form["client_id"] = args.client_id
        form["client_secret"] = args.client_secret
        return None
    return (args.client_id, args.client_secret)


def browser_sign_in(s, args):
    sign_in(s, args.issuer, args.username, args.password)
    grant_consent(s, args.issuer, args.client_id, args.scope)


def token_request(s, endpoint, args, form):
    basic = client_auth(args, form)
    status, _, body = s.request("POST", endpoint, form=form, basic=basic)
    return status, body


def finish(status, body, what):
    doc = parse_json(body)
    if status == 200 and isinstance(doc, dict) and "access_token" in doc:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    text = body.decode(errors="replace")[:300] or "(empty body)"
    if 400 <= status < 500:
        print("refused: %s: token endpoint answered HTTP %s %s" % (what, status, text), file=sys.stderr)
        return REFUSED
    die("%s: token endpoint answered HTTP %s %s" % (what, status, text))


def code_flow(s, disco, args):
    browser_sign_in(s, args)
    verifier, challenge = pkce_pair()
    state = random_string()
    nonce = random_string()
    url = disco["authorization_endpoint"] + "?" + urllib.parse.urlencode({
        "response_type": "code",
        "client_id": args.client_id,
        "redirect_uri": args.redirect_uri,
        "scope": args.scope,
        "state": state,
        "nonce": nonce,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    })
    status, location, body = authorize(s, url)
    if status != 302 or not location:
        die("authorization endpoint answered HTTP %s (expected 302 to %s): %s"
            % (status, args.redirect_uri, body.decode(errors="replace")[:200]))
    if not same_endpoint(location, args.redirect_uri):
        die("authorization endpoint redirected to %s, not to the redirect URI "
            "(not signed in, no consent, or redirect_uri not registered)" % location)
    params = query_params(location)
    if "error" in params:
        die("authorization endpoint returned error=%s %s"
            % (params["error"], params.get("error_description", "")))
    if params.get("state") != state:
        die("state mismatch in redirect: %s" % location)
    code = params.get("code")
    if not code:
        die("no code in redirect: %s" % location)
    if args.verifier_mismatch:
        verifier, _ = pkce_pair()  # well-formed, but not the one hashed
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": args.redirect_uri,
        "code_verifier": verifier,
    }
    status, body = token_request(s, disco["token_endpoint"], args, form)
    rc = finish(status, body, "authorization_code grant" + (" with a wrong verifier" if args.verifier_mismatch else ""))
    if args.verifier_mismatch:
        if rc == REFUSED:
            print("ok: the wrong PKCE verifier was refused", file=sys.stderr)
        elif rc == 0:
            print("error: the server ACCEPTED a wrong PKCE verifier", file=sys.stderr)
    return rc


def password_flow(s, disco, args):
    form = {
        "grant_type": "password",
        "username": args.username,
        "password": args.password,
        "scope": args.scope,
    }
    status, body = token_request(s, disco["token_endpoint"], args, form)
    return finish(status, body, "password grant")


def device_flow(s, disco, args):
    endpoint = disco.get("device_authorization_endpoint")
    if not endpoint:
        die("discovery has no device_authorization_endpoint")
    form = {"scope": args.scope}
    basic = client_auth(args, form)
    status, _, body = s.request("POST", endpoint, form=form, basic=basic)
    dev = parse_json(body)
    if status != 200 or not isinstance(dev, dict) or "device_code" not in dev:
        die("device authorization answered HTTP %s %s" % (status, body.decode(errors="replace")[:200]))
    browser_sign_in(s, args)
    approved, status, prompt, location = approve_device(s, args.issuer, dev["user_code"])
    if not approved:
        die("approving user code %s answered HTTP %s, prompt=%s (%s)" % (dev["user_code"], status, prompt, location))
    interval = float(dev.get("interval") or 5)
    deadline = time.time() + float(dev.get("expires_in") or 600)
    while True:
        form = {"grant_type": "urn:ietf:params:oauth:grant-type:device_code",
                "device_code": dev["device_code"]}
        status, body = token_request(s, disco["token_endpoint"], args, form)
        err = (parse_json(body) or {}).get("error") if status == 400 else None
        if err == "authorization_pending" and time.time() < deadline:
            time.sleep(interval)
            continue
        if err == "slow_down" and time.time() < deadline:
            interval += 5
            time.sleep(interval)
            continue
        return finish(status, body, "device_code grant")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--issuer", required=True)
    ap.add_argument("--client-id", required=True)
    ap.add_argument("--client-secret")
    ap.add_argument("--client-auth", choices=("basic", "post"), default="basic")
    ap.add_argument("--scope", default="openid offline_access profile email")
    ap.add_argument("--username", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--redirect-uri", default="http://127.0.0.1:53682/callback")
    ap.add_argument("--grant", choices=("code", "password", "device"), default="code")
    ap.add_argument("--verifier-mismatch", action="store_true",
                    help="redeem the code with a wrong PKCE verifier; expect exit 3")
    args = ap.parse_args()
    if args.verifier_mismatch and args.grant != "code":
        ap.error("--verifier-mismatch only applies to --grant code")
    s = Session()
    disco = discovery(args.issuer, s)
    flows = {"code": code_flow, "password": password_flow, "device": device_flow}
    sys.exit(flows[args.grant](s, disco, args))


if __name__ == "__main__":
    main()
