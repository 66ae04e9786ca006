#!/usr/bin/env python3
"""Play the user's browser for an authorization request a client built.

  browser.py --issuer ISSUER --url AUTHORIZATION_URL
             [--redirect-uri URI --scope SCOPE]
             [--username ada --password 'correct horse']
             [--deny | --wrong-state | --no-visit] [--timeout 30]

AUTHORIZATION_URL is what the client would open in a browser: the provider's
authorization endpoint with response_type, client_id, redirect_uri, scope,
state, nonce, code_challenge and code_challenge_method=S256. The script takes
client_id, redirect_uri, scope and state from it.

A pushed authorization request (RFC 9126) gives a URL with only client_id and
request_uri (ISSUER/auth?client_id=CID&request_uri=URN): pass the redirect_uri
and scope that were pushed with --redirect-uri and --scope (used only when the
URL has none). The code redirect then carries the pushed state.

Default: signs in through Glewlwyd's login API (POST /api/auth/), grants
  consent for that client_id and scope (PUT /api/auth/grant/CLIENT), GETs the
  URL with g_continue appended using the session cookie (no redirect
  following), and then GETs the 302 Location (redirect_uri?code=...&state=...)
  from the client's loopback listener, as a browser would. If the provider
  redirects to redirect_uri with an error (error=...), that is followed too
  (a note goes to stderr).
--deny: does not contact the provider; GETs redirect_uri?error=access_denied&
  state=STATE itself, what a browser brings back when the user declines.
--wrong-state: the real code flow, but the state in the Location is replaced
  by a different value before the loopback listener is visited.
--no-visit: the real code flow, but only {"location": the redirect} is
  printed; nothing need listen on redirect_uri.

Prints one JSON object on stdout:
  {"status": HTTP status of the loopback page, "body": its text,
   "location": the redirect URL the loopback page was fetched from}
with --wrong-state also "original_location" (the provider's untampered
redirect, whose code the client must not have redeemed).
Exit codes: 0 the loopback page was fetched (whatever its status); 1 anything
else (sign-in refused, the provider did not redirect to redirect_uri, nothing
listening on the loopback, ...), with a message on stderr; 2 bad usage.
"""

import argparse
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.parse

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gwlib import (Session, authorize, die, grant_consent, query_params,  # noqa: E402
                   random_string, same_endpoint, sign_in, text)


def add_query(url, params):
    return url + ("&" if urllib.parse.urlsplit(url).query else "?") + urllib.parse.urlencode(params)


def replace_param(url, name, value):
    parts = urllib.parse.urlsplit(url)
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if any(k == name for k, _ in pairs):
        pairs = [(k, value if k == name else v) for k, v in pairs]
    else:
        pairs.append((name, value))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(pairs)))


def provider_redirect(args, req):
    """Signs in, consents, calls the authorization endpoint; returns its Location."""
    s = Session(timeout=args.timeout)
    sign_in(s, args.issuer, args.username, args.password)
    grant_consent(s, args.issuer, req["client_id"], req["scope"])
    status, location, body = authorize(s, args.url)
    if status != 302 or not location:
        hint = ""
        if status == 403 and "request_uri" in query_params(args.url):
            hint = " (a pushed request_uri is good for one authorization, within its expires_in," \
                   " and needs client_id beside it; Glewlwyd answers 403 'Invalid request' otherwise)"
        elif status == 403:
            hint = " (Glewlwyd answers 403 with an empty body when redirect_uri is not registered" \
                   " exactly, port included: provision.py add-redirect-uri, or when the issuer" \
                   " requires pushed authorization requests)"
        die("authorization endpoint answered HTTP %s, not a redirect to %s: %s%s"
            % (status, req["redirect_uri"], text(body), hint))
    if not same_endpoint(location, req["redirect_uri"]):
        die("authorization endpoint redirected to %s, not to redirect_uri %s "
            "(sign-in or consent did not take, or the request was refused)" % (location, req["redirect_uri"]))
    params = query_params(location)
    if "error" in params:
        desc = params.get("error_description")
        print("note: the provider redirected with error=%s%s" % (params["error"], " (%s)" % desc if desc else ""),
              file=sys.stderr)
    elif "code" not in params:
        print("note: no code in the provider's redirect %s" % location, file=sys.stderr)
    return location


def visit_loopback(url, timeout):
    """GET the client's loopback listener like a browser (fresh cookie jar, no redirects)."""
    try:
        status, _, body = Session(timeout=timeout).request("GET", url, headers={"Accept": "text/html,*/*"})
    except urllib.error.URLError as e:
        die("could not fetch %s from the client's loopback listener: %s" % (url, e.reason))
    except (socket.timeout, TimeoutError):
        die("the client's loopback listener at %s did not answer within %gs" % (url, timeout))
    except (OSError, http.client.HTTPException) as e:
        die("could not fetch %s from the client's loopback listener: %s" % (url, e))
    return status, body.decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--issuer", required=True)
    ap.add_argument("--url", required=True, help="the authorization request URL the client built")
    ap.add_argument("--redirect-uri",
                    help="the redirect_uri, when the URL has none (a pushed request: client_id + request_uri)")
    ap.add_argument("--scope", help="the scope to consent to, when the URL has none (a pushed request)")
    ap.add_argument("--username", default="ada")
    ap.add_argument("--password", default="correct horse")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--deny", action="store_true",
                      help="skip the provider; bring error=access_denied back to redirect_uri")
    mode.add_argument("--wrong-state", action="store_true",
                      help="real code flow, but visit the loopback with a tampered state")
    mode.add_argument("--no-visit", action="store_true",
                      help="real code flow, but only print the redirect; nothing need listen on redirect_uri")
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for each HTTP answer (default 30)")
    args = ap.parse_args()

    req = query_params(args.url)
    for name, given in (("redirect_uri", args.redirect_uri), ("scope", args.scope)):
        if not req.get(name) and given:
            req[name] = given
    for name in ("client_id", "redirect_uri") + (() if args.deny else ("scope",)):
        if not req.get(name):
            option = {"redirect_uri": " (or --redirect-uri)", "scope": " (or --scope)"}.get(name, "")
            die("the authorization URL has no %s%s: %s" % (name, option, args.url))
    if urllib.parse.urlsplit(req["redirect_uri"]).scheme not in ("http", "https"):
        die("redirect_uri %r is not an http(s) URL" % req["redirect_uri"])

    out = {}
    if args.deny:
        params = {"error": "access_denied"}
        if "state" in req:
            params["state"] = req["state"]
        location = add_query(req["redirect_uri"], params)
    else:
        location = provider_redirect(args, req)
        if args.wrong_state:
            out["original_location"] = location
            state = query_params(location).get("state", "")
            location = replace_param(location, "state", state + "-tampered-" + random_string(6))
        elif args.no_visit:
            print(json.dumps({"location": location}))
            sys.exit(0)
    status, body = visit_loopback(location, args.timeout)
    result = {"status": status, "body": body, "location": location}
    result.update(out)
    print(json.dumps(result))
    sys.exit(0)


if __name__ == "__main__":
    main()
