#!/usr/bin/env python3
"""Check a running test Glewlwyd (started by start.sh DIR) does what the tests rely on.

  selftest.py DIR

Reads DIR/env, exercises every client through login.py / introspect.py and
plain token-endpoint calls, and prints one line per check plus a closing
"N passed, N failed" line. Exit 0 only when everything passed. Takes a few
seconds (it waits once for an access token to expire).
"""

import base64
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep the work tree free of __pycache__
sys.path.insert(0, HERE)
from gwlib import Session, parse_json, pkce_pair, random_string  # noqa: E402

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok   - %s" % name)
    else:
        failed += 1
        print("FAIL - %s %s" % (name, detail))
    return ok


def load_env(d):
    env = {}
    with open(os.path.join(d, "env")) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            if len(v) >= 2 and v[0] == v[-1] == "'":
                v = v[1:-1]
            env[k] = v
    return env


def jwt_parts(tok):
    def dec(x):
        return json.loads(base64.urlsafe_b64decode(x + "=" * (-len(x) % 4)))
    h, p, _ = tok.split(".")
    return dec(h), dec(p)


class _Callback(http.server.BaseHTTPRequestHandler):
    """A client's loopback listener: records each query, 200 with code, 400 otherwise."""
    def do_GET(self):
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        self.server.seen.append(q)
        ok = "code" in q and "error" not in q
        body = b"signed in" if ok else b"sign-in failed"
        self.send_response(200 if ok else 400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def main():
    if len(sys.argv) != 2:
        print("usage: selftest.py DIR", file=sys.stderr)
        sys.exit(2)
    E = load_env(sys.argv[1])
    I = E["GLEWLWYD_ISSUER"]
    AT = int(E["GLEWLWYD_ACCESS_TOKEN_SECONDS"])
    USER, PW = E["GLEWLWYD_USERNAME"], E["GLEWLWYD_PASSWORD"]
    s = Session()

    st, _, b = s.request("GET", I + "/.well-known/openid-configuration")
    D = parse_json(b) or {}
    check("discovery answers, issuer matches env", st == 200 and D.get("issuer") == I, "%s %s" % (st, D.get("issuer")))
    for k in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri", "revocation_endpoint",
              "introspection_endpoint", "end_session_endpoint", "device_authorization_endpoint"):
        check("discovery has %s" % k, bool(D.get(k)))
    check("discovery: S256 only", D.get("code_challenge_methods_supported") == ["S256"],
          D.get("code_challenge_methods_supported"))

    def login(cid, secret=None, grant="code", extra=()):
        a = [sys.executable, os.path.join(HERE, "login.py"), "--issuer", I, "--client-id", cid,
             "--username", USER, "--password", PW, "--grant", grant] + list(extra)
        if secret:
            a += ["--client-secret", secret]
        p = subprocess.run(a, capture_output=True, text=True, timeout=60)
        return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else None), p.stderr.strip()

    def token(form, cid, secret=None):
        form = dict(form)
        if secret is None:
            form["client_id"] = cid
            st, _, b = s.request("POST", D["token_endpoint"], form=form)
        else:
            st, _, b = s.request("POST", D["token_endpoint"], form=form, basic=(cid, secret))
        return st, parse_json(b), b

    def introspect(tok, cid, secret):
        p = subprocess.run([sys.executable, os.path.join(HERE, "introspect.py"), "--issuer", I,
                            "--client-id", cid, "--client-secret", secret],
                           input=tok, capture_output=True, text=True, timeout=30)
        return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr}

    clients = [
        (E["GLEWLWYD_PUBLIC_CLIENT_ID"], None, False),
        (E["GLEWLWYD_PUBLIC_ROTATING_CLIENT_ID"], None, True),
        (E["GLEWLWYD_CONFIDENTIAL_CLIENT_ID"], E["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"], False),
        (E["GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_ID"], E["GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_SECRET"], True),
    ]
    st, _, b = s.request("GET", D["jwks_uri"])
    kids = [k.get("kid") for k in (parse_json(b) or {}).get("keys", [])]
    check("jwks has one RS256 key with kid", st == 200 and len(kids) == 1 and kids[0], kids)

    for cid, secret, rotating in clients:
        rc, t, err = login(cid, secret)
        if not check("%s: code+PKCE login" % cid, rc == 0 and t and t.get("refresh_token"), err):
            continue
        check("%s: token_type 'bearer', expires_in == %d" % (cid, AT),
              t.get("token_type") == "bearer" and t.get("expires_in") == AT,
              (t.get("token_type"), t.get("expires_in")))
        ah, ap = jwt_parts(t["access_token"])
        ih, ip = jwt_parts(t["id_token"])
        check("%s: AT is RS256 at+jwt signed with the jwks kid" % cid,
              ah.get("alg") == "RS256" and ah.get("typ") == "at+jwt" and ah.get("kid") in kids, ah)
        check("%s: id_token iss/aud/email/name" % cid,
              ip.get("iss") == I and ip.get("aud") == cid and ip.get("email") == E["GLEWLWYD_EMAIL"]
              and ip.get("name") == "Ada Lovelace", ip)
        st, j, b = token({"grant_type": "refresh_token", "refresh_token": t["refresh_token"]}, cid, secret)
        check("%s: refresh answers 200 with a new access token" % cid,
              st == 200 and j and j.get("access_token") and j["access_token"] != t["access_token"], (st, b[:80]))
        if rotating:
            new_rt = (j or {}).get("refresh_token")
            check("%s: rotation returns a new refresh token" % cid, new_rt and new_rt != t["refresh_token"])
            st2, _, b2 = token({"grant_type": "refresh_token", "refresh_token": t["refresh_token"]}, cid, secret)
            check("%s: reusing the old refresh token fails (400, empty body)" % cid, st2 == 400 and b2 == b"",
                  (st2, b2[:80]))
            st3, _, _ = token({"grant_type": "refresh_token", "refresh_token": new_rt or ""}, cid, secret)
            check("%s: after the replay the newest refresh token is dead too" % cid, st3 == 400, st3)
        else:
            check("%s: no rotation: no refresh_token in the refresh response" % cid,
                  j is not None and "refresh_token" not in j, j and sorted(j))
            st2, _, _ = token({"grant_type": "refresh_token", "refresh_token": t["refresh_token"]}, cid, secret)
            check("%s: no rotation: the same refresh token works again" % cid, st2 == 200, st2)
        st, _, b = s.request("GET", D["userinfo_endpoint"], headers={"Authorization": "Bearer " + j["access_token"]})
        ui = parse_json(b) or {}
        check("%s: userinfo with the fresh AT" % cid, st == 200 and ui.get("email") == E["GLEWLWYD_EMAIL"], (st, b[:80]))

    pub, conf = clients[0], clients[2]

    rc, _, err = login(pub[0], extra=["--verifier-mismatch"])
    check("wrong PKCE verifier refused (login.py exit 3)", rc == 3, (rc, err))

    rc, _, err = login(pub[0], extra=["--redirect-uri", "http://127.0.0.1:53683/callback"])
    check("unregistered loopback port refused (exact redirect_uri match)", rc == 1 and "403" in err, (rc, err))
    for uri in ("http://localhost:53682/callback", "http://[::1]:53682/callback"):
        rc, _, err = login(pub[0], extra=["--redirect-uri", uri])
        check("registered %s accepted" % uri, rc == 0, err)

    rc, _, err = login(conf[0], "not-the-secret")
    check("code exchange with a wrong client secret refused (exit 3)", rc == 3, (rc, err))

    rc, t, err = login(conf[0], conf[1], grant="password")
    check("password grant, confidential client", rc == 0 and t.get("refresh_token"), err)
    rc, _, err = login(pub[0], grant="password")
    check("password grant refused for a public client (exit 3)", rc == 3, (rc, err))

    for cid, secret in ((pub[0], None), (conf[0], conf[1])):
        rc, t, err = login(cid, secret, grant="device")
        check("device grant, %s" % cid, rc == 0 and t.get("refresh_token"), err)

    st, j, b = token({"grant_type": "client_credentials", "scope": "profile"}, conf[0], conf[1])
    check("client_credentials, confidential client", st == 200 and j and j.get("access_token"), (st, b[:80]))

    # Revocation + introspection (confidential only; public clients get 401).
    rc, t, err = login(conf[0], conf[1])
    i1 = introspect(t["refresh_token"], conf[0], conf[1])
    check("introspect live refresh token: active true", i1.get("active") is True, i1)
    i2 = introspect(t["access_token"], conf[0], conf[1])
    check("introspect live access token: active true, username ada", i2.get("active") is True
          and i2.get("username") == USER, i2)
    st, _, b = s.request("POST", D["revocation_endpoint"], form={"token": t["refresh_token"],
                         "token_type_hint": "refresh_token"}, basic=conf[:2])
    check("revoke refresh token with client_secret_basic: 200", st == 200, (st, b[:80]))
    i3 = introspect(t["refresh_token"], conf[0], conf[1])
    check("introspect revoked refresh token: active false", i3.get("active") is False, i3)
    st, _, _ = token({"grant_type": "refresh_token", "refresh_token": t["refresh_token"]}, conf[0], conf[1])
    check("refresh with the revoked token: 400", st == 400, st)

    rc, t, err = login(pub[0])
    st, _, _ = s.request("POST", D["revocation_endpoint"], form={"token": t["refresh_token"], "client_id": pub[0]})
    check("public client cannot revoke (401)", st == 401, st)

    # Access-token expiry.
    rc, t, err = login(conf[0], conf[1])
    time.sleep(AT + 1.1)
    i4 = introspect(t["access_token"], conf[0], conf[1])
    check("access token inactive after %ds" % AT, i4.get("active") is False, i4)
    st, _, _ = s.request("GET", D["userinfo_endpoint"], headers={"Authorization": "Bearer " + t["access_token"]})
    check("userinfo with an expired AT: 401", st == 401, st)

    # browser.py / approve-device.py against a loopback listener of our own, on an
    # ephemeral port registered first (so a test already on 53682 cannot collide).
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Callback)
    srv.seen = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cb = "http://127.0.0.1:%d/callback" % srv.server_address[1]
    p = subprocess.run([sys.executable, os.path.join(HERE, "provision.py"), "--base", E["GLEWLWYD_BASE_URL"],
                        "add-redirect-uri", pub[0], cb], capture_output=True, text=True, timeout=30)
    check("provision.py add-redirect-uri %s" % cb, p.returncode == 0, p.stderr.strip())

    def browser(extra=()):
        verifier, challenge = pkce_pair()
        state = random_string()
        url = D["authorization_endpoint"] + "?" + urllib.parse.urlencode({
            "response_type": "code", "client_id": pub[0], "redirect_uri": cb, "scope": E["GLEWLWYD_SCOPE"],
            "state": state, "nonce": random_string(), "code_challenge": challenge, "code_challenge_method": "S256"})
        p = subprocess.run([sys.executable, os.path.join(HERE, "browser.py"), "--issuer", I, "--url", url,
                            "--username", USER, "--password", PW] + list(extra),
                           capture_output=True, text=True, timeout=60)
        out = json.loads(p.stdout) if p.returncode == 0 else {}
        return p.returncode, out, (srv.seen[-1] if srv.seen else {}), state, verifier, p.stderr.strip()

    rc, out, q, state, verifier, err = browser()
    check("browser.py: loopback got code + state, page 200", rc == 0 and out.get("status") == 200
          and q.get("state") == state and q.get("code"), (rc, out, q, err))
    st, j, b = token({"grant_type": "authorization_code", "code": q.get("code", ""), "redirect_uri": cb,
                      "code_verifier": verifier}, pub[0])
    check("browser.py: the code redeems for tokens", st == 200 and j and j.get("access_token"), (st, b[:80]))
    rc, out, q, state, _, err = browser(["--deny"])
    check("browser.py --deny: loopback got error=access_denied + state",
          rc == 0 and out.get("status") == 400 and q == {"error": "access_denied", "state": state}, (rc, out, q, err))
    rc, out, q, state, _, err = browser(["--wrong-state"])
    check("browser.py --wrong-state: loopback got a code with another state",
          rc == 0 and q.get("code") and q.get("state") not in (None, state), (rc, out, q, err))
    srv.shutdown()
    srv.server_close()
    rc, out, q, _, _, err = browser()
    check("browser.py with nothing listening: exit 1", rc == 1 and "loopback" in err, (rc, err))

    st, _, b = s.request("POST", D["device_authorization_endpoint"], form={"client_id": pub[0], "scope": E["GLEWLWYD_SCOPE"]})
    dev = parse_json(b) or {}
    form = {"grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": dev.get("device_code", "")}
    st, j, b = token(form, pub[0])
    check("device: polling before approval: 400 authorization_pending", st == 400 and (j or {}).get("error")
          == "authorization_pending", (st, b[:80]))
    ap = [sys.executable, os.path.join(HERE, "approve-device.py"), "--issuer", I, "--user-code", dev.get("user_code", ""),
          "--username", USER, "--password", PW]
    p = subprocess.run(ap, capture_output=True, text=True, timeout=30)
    check("approve-device.py: exit 0, approved", p.returncode == 0 and json.loads(p.stdout).get("approved") is True,
          (p.returncode, p.stdout, p.stderr))
    time.sleep(float(E["GLEWLWYD_DEVICE_INTERVAL"]) + 0.1)  # polling faster than interval gets slow_down
    st, j, b = token(form, pub[0])
    check("device: polling after approval: tokens", st == 200 and j and j.get("access_token"), (st, b[:80]))
    p = subprocess.run(ap, capture_output=True, text=True, timeout=30)
    check("approve-device.py on a used code: exit 3 (deviceCodeError)", p.returncode == 3
          and json.loads(p.stdout).get("prompt") == "deviceCodeError", (p.returncode, p.stdout, p.stderr))

    # End session.
    q = urllib.parse.urlencode({"id_token_hint": t["id_token"]})
    st, h, _ = s.request("GET", D["end_session_endpoint"] + "?" + q)
    loc = (h.get("Location") if h else "") or ""
    check("end_session with id_token_hint: 302 to login.html?...prompt=end_session",
          st == 302 and "login.html" in loc and "prompt=end_session" in loc, (st, loc))

    print("%d passed, %d failed" % (passed, failed))
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
