"""Tiny HTTP helpers shared by the Glewlwyd test scripts (Python stdlib only).

Every request goes straight to the server (no proxy, no automatic redirect
following) and never raises on an HTTP error status: callers get
(status, headers, body_bytes) and decide.
"""

import base64
import http.cookiejar
import json
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


def die(msg, code=1):
    print("error: " + msg, file=sys.stderr)
    sys.exit(code)
