"""Tiny HTTP helpers shared by the Glewlwyd test scripts (Python stdlib only),
plus the steps of playing the user in a browser (sign in, consent, authorize,
approve a device code).

Every request goes straight to the server (no proxy, no automatic redirect
following) and never raises on an HTTP error status: callers get
(status, headers, body_bytes) and decide.
"""

import base64
import hashlib
import http.cookiejar
import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class Session:
    """A cookie-keeping HTTP client that reports redirects instead of following them."""

    def __init__(self, timeout=15.0):
        self.jar = http.cookiejar.CookieJar()
        self.timeout = timeout
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPCookieProcessor(self.jar),
            _NoRedirect(),
        )

    def request(self, method, url, json_body=None, form=None, headers=None, basic=None):
        data = None
        hdrs = {"Accept": "application/json"}
        if headers:
            hdrs.update(headers)
        if json_body is not None:
            data = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        elif form is not None:
            data = urllib.parse.urlencode(form).encode()
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        if basic is not None:
            user, pw = basic
            # RFC 6749 2.3.1: form-urlencode id and secret before base64.
            raw = "%s:%s" % (urllib.parse.quote(user, safe=""), urllib.parse.quote(pw, safe=""))
            hdrs["Authorization"] = "Basic " + base64.b64encode(raw.encode()).decode()
        req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
        try:
            with self.opener.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            body = e.read() if e.fp is not None else b""
            return e.code, e.headers, body


def parse_json(body):
    try:
        return json.loads(body.decode() or "null")
    except (ValueError, UnicodeDecodeError):
        return None


def discovery(issuer, session=None):
    s = session or Session()
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    status, _, body = s.request("GET", url)
    doc = parse_json(body)
    if status != 200 or not isinstance(doc, dict):
        raise SystemExit("error: discovery %s answered HTTP %s" % (url, status))
    return doc


def api_base(issuer):
    """Glewlwyd's API root (http://host:port/api) from an issuer like .../api/oidc."""
    iss = issuer.rstrip("/")
    if not iss.endswith("/oidc"):
        raise SystemExit("error: issuer %r does not end in /oidc; cannot find Glewlwyd's /api" % issuer)
    return iss[: -len("/oidc")]


def load_env(directory):
    """The KEY='VALUE' lines start.sh writes to DIR/env, as a dict."""
    path = os.path.join(directory, "env")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        die("cannot read %s (is %s a folder start.sh made?): %s" % (path, directory, e.strerror))
    env = {}
    for line in lines:
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        if len(v) >= 2 and v[0] == v[-1] == "'":
            v = v[1:-1]
        env[k] = v
    return env


def die(msg, code=1):
    print("error: " + msg, file=sys.stderr)
    sys.exit(code)


def text(body, limit=200):
    """A response body for an error message ("(empty body)" when there is none)."""
    return body.decode(errors="replace")[:limit] or "(empty body)"


# --- PKCE ---------------------------------------------------------------------

def b64url(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def random_string(nbytes=12):
    return b64url(secrets.token_bytes(nbytes))


def pkce_pair():
    """(code_verifier, S256 code_challenge)."""
    verifier = b64url(secrets.token_bytes(32))
    return verifier, b64url(hashlib.sha256(verifier.encode()).digest())


# --- Playing the user in a browser --------------------------------------------
#
# Glewlwyd's web app is only a front end for these API calls; a Session that
# makes them holds the same session cookie a browser would.

def sign_in(s, issuer, username, password):
    """POST /api/auth/ (the login form): leaves the session cookie in s."""
    status, _, body = s.request("POST", api_base(issuer) + "/auth/",
                                json_body={"username": username, "password": password})
    if status != 200:
        die("sign-in as %r refused: HTTP %s %s" % (username, status, text(body)))


def grant_consent(s, issuer, client_id, scope):
    """PUT /api/auth/grant/CLIENT (the consent screen) for a space-separated scope."""
    status, _, body = s.request("PUT", api_base(issuer) + "/auth/grant/" + urllib.parse.quote(client_id, safe=""),
                                json_body={"scope": scope})
    if status != 200:
        die("consent for %s refused: HTTP %s %s" % (client_id, status, text(body)))


def with_g_continue(url):
    """The URL the web app sends the browser back to after sign-in and consent."""
    return url + ("&" if urllib.parse.urlsplit(url).query else "?") + "g_continue"


def authorize(s, authorization_url):
    """GET an authorization request URL (plus g_continue) with the session in s,
    without following the redirect. Returns (status, location or "", body)."""
    status, headers, body = s.request("GET", with_g_continue(authorization_url),
                                      headers={"Accept": "text/html,*/*"})
    return status, ((headers.get("Location") if headers else None) or ""), body


def same_endpoint(url, redirect_uri):
    """True when url is redirect_uri plus query parameters (scheme, host, port, path equal)."""
    a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(redirect_uri)
    return (a.scheme, a.netloc, a.path) == (b.scheme, b.netloc, b.path)


def query_params(url):
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True))


def approve_device(s, issuer, user_code):
    """GET /api/oidc/device?code=USER_CODE&g_continue with the session in s, which
    approves a device authorization. Glewlwyd always answers 302 to login.html
    with a prompt telling the outcome: deviceComplete (approved), deviceCodeError
    (unknown, expired or already used code), deviceServerError, or no prompt at
    all (not signed in). Returns (approved, status, prompt or None, location)."""
    url = api_base(issuer) + "/oidc/device?" + urllib.parse.urlencode({"code": user_code}) + "&g_continue"
    status, headers, _ = s.request("GET", url, headers={"Accept": "text/html,*/*"})
    location = (headers.get("Location") if headers else None) or ""
    prompt = query_params(location).get("prompt") if location else None
    return status == 302 and prompt == "deviceComplete", status, prompt, location


# --- Dynamic client registration (RFC 7591) ----------------------------------

def initial_access_token(issuer, client_id, secret, scope="register", session=None):
    """A fresh initial access token: the client_credentials grant for scope,
    with HTTP Basic. Glewlwyd's registration endpoint takes any access token
    of its plugin that carries the configured scope; with
    register-client-token-one-use each token registers one client."""
    s = session or Session()
    token_endpoint = discovery(issuer, s)["token_endpoint"]
    status, _, body = s.request("POST", token_endpoint,
                                form={"grant_type": "client_credentials", "scope": scope},
                                basic=(client_id, secret))
    doc = parse_json(body)
    if status != 200 or not isinstance(doc, dict) or not doc.get("access_token"):
        die("client_credentials for %s with scope %r answered HTTP %s %s"
            % (client_id, scope, status, text(body)))
    return doc["access_token"]
