#!/usr/bin/env python3
"""Soak test of vaultd against a real, rotating OpenID provider.

  Tests/Soak/soak.py --bin FOLDER [SECONDS]      (normally through Tests/Soak/soak.sh)

Starts Glewlwyd on 127.0.0.1 (demo/glewlwyd/start.sh, 5-second access
tokens), runs FOLDER/vaultd with the sealed-file backend in a temporary XDG
tree and signs three accounts in on the rotating confidential client, whose
every refresh spends the refresh token. Client threads then ask the accounts
for tokens in mixed scope sets with a small min_ttl, while accounts sign out
and in again every few seconds and vaultd is SIGKILLed every ~20 s (half the
time as Glewlwyd rotates a token) and started again. Before the clients come
back, each account's refresh token is looked up in Glewlwyd's database; one
spent on a single answer that the killed vaultd never wrote is a session lost
in the kill window, and that account signs in again before anyone presents it.

Prints `name: value` lines, the five goals first (see Soak.report); exit 0
when every goal is 0, 1 when one is not, 2 when the setup failed.

Environment: SOAK_SECONDS (600), SOAK_CLIENTS (200), SOAK_KILL_SECONDS (20),
SOAK_SEED, SOAK_KEEP=1 (keep the work folder WORK; kept anyway on failure).
Never prints a token or a password.
"""

import argparse, json, os, random, signal, socket, subprocess, sys, tempfile, threading, time
from importlib import import_module

sys.dont_write_bytecode = True
GLEWLWYD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "demo", "glewlwyd")
sys.path.insert(0, GLEWLWYD)
refresh_chain = import_module("refresh-chain")

ACCOUNTS = ("alpha", "bravo", "charlie")
SCOPE_SETS = (None, "openid offline_access", "openid profile")  # None: the account's own
MIN_TTLS = (1, 2, 3)  # seconds, against 5-second access tokens
ACCESS_TOKEN_SECONDS = 5
CYCLE_EVERY = (4.0, 8.0)  # seconds between sign-out/sign-in cycles
SIGNED_OUT_FOR = 0.5  # how long an account stays signed out in a cycle
CLIENT_PAUSE = 0.05  # about this long between a client's requests


def say(text):
    print("soak: " + text, file=sys.stderr, flush=True)


def call(path, request, timeout=30.0):
    """One request on a fresh connection; the reply as a dict."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall((json.dumps(request) + "\n").encode())
        line = s.makefile("rb").readline()
    if not line.endswith(b"\n"):
        raise ConnectionError("vaultd closed the connection")
    return json.loads(line)


def error_code(reply):
    return None if reply.get("ok") else (reply.get("error") or {}).get("code", "?")


class Vaultd:
    """The vaultd of the moment, started again after each kill."""

    def __init__(self, binary, work):
        self.binary, self.work = binary, work
        self.socket = work + "/run/vaultd.sock"
        self.proc, self.incarnation, self.killed = None, 0, False
        os.makedirs(work + "/run", mode=0o700)
        os.makedirs(work + "/logs")

    def start(self):
        self.incarnation += 1
        env = dict(os.environ, XDG_STATE_HOME=self.work + "/state", XDG_CONFIG_HOME=self.work + "/config",
                   XDG_RUNTIME_DIR=self.work + "/run", DBUS_SESSION_BUS_ADDRESS="unix:path=%s/no-bus" % self.work,
                   JOURNAL_STREAM="")
        with open("%s/logs/vaultd.%d.log" % (self.work, self.incarnation), "wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--socket", self.socket, "--backend", "file", "--key-source", "keyfile",
                 "--log-level", "notice"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        self.killed = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if call(self.socket, {"op": "status"}, timeout=5).get("ok"):
                    return
            except (OSError, ValueError):
                time.sleep(0.02)
        raise RuntimeError("vaultd did not start; see %s/logs" % self.work)

    def kill(self):
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def crashed(self):
        return self.proc.poll() is not None and not self.killed

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class Glewlwyd:
    """The provider, through the project's demo/glewlwyd."""

    def __init__(self, folder):
        self.folder, self.env, self.log_start = folder, {}, 0

    def start(self):
        env = dict(os.environ, GLEWLWYD_ACCESS_TOKEN_SECONDS=str(ACCESS_TOKEN_SECONDS))
        subprocess.run([GLEWLWYD + "/start.sh", self.folder], env=env, stdout=subprocess.DEVNULL, check=True)
        with open(self.folder + "/env") as f:
            self.env = dict((k, v.strip("'")) for k, _, v in (line.strip().partition("=") for line in f))
        self.log_start = os.path.getsize(self.folder + "/glewlwyd.log")

    def log_count(self, text):
        """How often the log says `text` since the provider was ready."""
        with open(self.folder + "/glewlwyd.log", "rb") as f:
            f.seek(self.log_start)
            return f.read().count(text.encode())

    def wait_quiet(self, seconds=10):
        """Waits until every request of a killed vaultd has finished at the provider, so
        its database may be read (a reader while Glewlwyd writes makes its query fail)."""
        port, deadline = int(self.env["GLEWLWYD_PORT"]), time.monotonic() + seconds
        while time.monotonic() < deadline:
            with open("/proc/net/tcp") as f:
                rows = [line.split() for line in list(f)[1:]]
            # Still open: any state but LISTEN, TIME-WAIT and CLOSE.
            if not any(int(r[1].split(":")[1], 16) == port and r[3] not in ("0A", "06", "07") for r in rows):
                return
            time.sleep(0.005)

    def stop(self):
        if os.path.isdir(self.folder):
            subprocess.run([GLEWLWYD + "/stop.sh", self.folder], stderr=subprocess.DEVNULL)


def client(socket_path, answers, lost, up, stop, rng):
    """Asks random accounts for random scope sets until `stop`, appending
    (account, sent, answered, error code or None) to `answers`. Connects only
    while `up` (vaultd is running and checked)."""
    conn = replies = None
    while not stop.is_set():
        account = rng.choice(ACCOUNTS)
        request = {"op": "token", "account": account, "min_ttl": rng.choice(MIN_TTLS)}
        scope = rng.choice(SCOPE_SETS)
        if scope:
            request["scope"] = scope
        try:
            if conn is None:
                up.wait()
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.settimeout(60)
                conn.connect(socket_path)
                replies = conn.makefile("rb")
                if not up.is_set():  # killed and started again meanwhile: wait for the checks
                    raise ConnectionError("not yet")
            sent = time.monotonic()
            conn.sendall((json.dumps(request) + "\n").encode())
            line = replies.readline()
            if not line.endswith(b"\n"):
                raise ConnectionError("closed")
            code = error_code(json.loads(line))
            answers.append((account, sent, time.monotonic(), code))
            if code == "reauth_required":
                lost.add(account)
        except (OSError, ValueError):
            for f in (replies, conn):
                if f is not None:
                    f.close()
            conn = replies = None
            answers.append((account, None, None, "no_daemon"))
            time.sleep(0.05)
        stop.wait(CLIENT_PAUSE * rng.uniform(0.5, 1.5))


def spans(marks, start, end, until):
    """The [start mark, next end mark) intervals in one account's marks."""
    found, opened = [], None
    for t, what in marks:
        if what == start and opened is None:
            opened = t
        elif what == end and opened is not None:
            found.append((opened, t))
            opened = None
    return found + ([(opened, until)] if opened is not None else [])


class Soak:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.rng = random.Random(args.seed)
        self.vault = Vaultd(os.path.join(args.bin, "vaultd"), work)
        self.gw = Glewlwyd(work + "/glewlwyd")
        self.up, self.stop = threading.Event(), threading.Event()
        self.marks = {a: [] for a in ACCOUNTS}  # (monotonic time, "signin_sent" | "signin_reply" | "signout_...")
        self.answers = []  # one list per client
        self.lost = set()  # accounts a client saw answer reauth_required
        self.signed_out = set()  # accounts to sign in again
        self.counts = dict(kills=0, at_rotation=0, window=0, cycles=0, stored_after_signout=0, crashes=0)

    def mark(self, account, what):
        self.marks[account].append((time.monotonic(), what))

    def setup(self):
        self.gw.start()
        self.vault.start()
        e = self.gw.env
        for account in ACCOUNTS:
            reply = call(self.vault.socket, {
                "op": "account.add", "name": account, "issuer": e["GLEWLWYD_ISSUER"],
                "client_id": e["GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_ID"],
                "client_secret": e["GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_SECRET"],
                "scopes": e["GLEWLWYD_SCOPE"].split(),
                # So that this program (its clients included) may read the
                # refresh token each account holds, after a kill.
                "allowed_clients": [os.readlink("/proc/self/exe")], "release_refresh_token": True})
            if not reply.get("ok"):
                raise RuntimeError("account.add %s: %s" % (account, error_code(reply)))
            self.sign_in(account)

    def sign_in(self, account):
        self.signed_out.add(account)
        self.mark(account, "signin_sent")
        for _ in range(20):
            reply = call(self.vault.socket, {"op": "signin.start", "account": account, "method": "password",
                                             "username": self.gw.env["GLEWLWYD_USERNAME"],
                                             "password": self.gw.env["GLEWLWYD_PASSWORD"]})
            if reply.get("state") == "signed_in":
                self.mark(account, "signin_reply")
                self.signed_out.discard(account)
                return
            time.sleep(0.5)
        raise RuntimeError("%s could not sign in: %s" % (account, error_code(reply) or reply.get("state")))

    def cycle(self, account):
        """Signs the account out, leaves it out a moment, signs it in again."""
        self.counts["cycles"] += 1
        self.signed_out.add(account)
        self.mark(account, "signout_sent")
        reply = call(self.vault.socket, {"op": "signout", "account": account})
        self.mark(account, "signout_reply")
        if not reply.get("ok"):
            raise RuntimeError("signout %s: %s" % (account, error_code(reply)))
        time.sleep(SIGNED_OUT_FOR)
        status = call(self.vault.socket, {"op": "status"})
        if any(a["name"] == account and a["signed_in"] for a in status.get("accounts", [])):
            self.counts["stored_after_signout"] += 1
        self.sign_in(account)

    def kill_and_restart(self):
        self.up.clear()
        self.counts["kills"] += 1
        if self.rng.random() < 0.5:
            watcher = subprocess.run([GLEWLWYD + "/on-rotation.py", self.gw.folder, "--pid", str(self.vault.proc.pid),
                                      "--timeout", "5"], stdout=subprocess.DEVNULL)
            self.counts["at_rotation"] += watcher.returncode == 0
        self.vault.kill()
        self.restart()

    def restart(self):
        """Starts vaultd again; before the clients come back, signs in again each account
        whose refresh token the issuer spent on one answer the killed vaultd never wrote."""
        self.up.clear()
        self.gw.wait_quiet()
        self.vault.start()
        for account in ACCOUNTS:
            reply = call(self.vault.socket, {"op": "refresh_token", "account": account})
            if not reply.get("ok"):
                continue  # signed out, or lost before the kill: the clients will tell
            chain = refresh_chain.chain_position(  # see demo/glewlwyd/refresh-chain.py
                self.gw.folder + "/glewlwyd.db", refresh_chain.token_hash(reply["refresh_token"]))
            if chain["known"] and not chain["enabled"] and chain["successors"] == 1 and chain["successor_enabled"]:
                self.counts["window"] += 1
                self.cycle(account)
        self.up.set()

    def run(self, seconds):
        self.answers = [[] for _ in range(self.args.clients)]
        threads = [threading.Thread(target=client, daemon=True, args=(
            self.vault.socket, answers, self.lost, self.up, self.stop, random.Random(self.rng.random())))
            for answers in self.answers]
        self.up.set()
        for t in threads:
            t.start()
        now = time.monotonic()
        end = now + seconds
        next_kill = now + self.args.kill_seconds * self.rng.uniform(0.75, 1.25)
        next_cycle = now + self.rng.uniform(*CYCLE_EVERY)
        while time.monotonic() < end:
            try:
                if self.vault.crashed():
                    self.counts["crashes"] += 1
                    say("vaultd exited with status %s; see %s/logs" % (self.vault.proc.returncode, self.work))
                    self.restart()
                for account in sorted(self.signed_out):
                    self.sign_in(account)  # a cycle that vaultd's crash cut short
                for account in sorted(self.lost):
                    self.lost.discard(account)
                    self.cycle(account)  # a lost session: sign in again so the soak goes on
                now = time.monotonic()
                if now >= next_kill:
                    self.kill_and_restart()
                    next_kill = time.monotonic() + self.args.kill_seconds * self.rng.uniform(0.75, 1.25)
                elif now >= next_cycle:
                    self.cycle(self.rng.choice(ACCOUNTS))
                    next_cycle = time.monotonic() + self.rng.uniform(*CYCLE_EVERY)
            except (OSError, ValueError) as e:
                say("vaultd did not answer the soak's own request (%s)" % type(e).__name__)
            time.sleep(0.05)
        self.stop.set()
        self.up.set()
        for t in threads:
            t.join(90)
        return time.monotonic()

    def report(self, until):
        """Judges the answers against the sign-ins and sign-outs and prints the figures.
        Goals, each 0: refresh tokens presented twice (Glewlwyd's "Token invalid"
        warnings: presented after being spent or revoked); tokens served to requests
        sent after a signout reply, before the next sign-in (listed in
        WORK/served-after-signout.txt); accounts found signed in half a second after
        their sign-out, unasked; sign-ins ended by reauth_required; vaultd exits we
        did not cause."""
        out = {a: spans(self.marks[a], "signout_reply", "signin_sent", until) for a in ACCOUNTS}
        signed_in = {a: spans(self.marks[a], "signin_reply", "signout_sent", until) for a in ACCOUNTS}
        served_after_signout, lost_sessions, latencies, refused = [], set(), [], {}
        for account, sent, answered, code in (answer for answers in self.answers for answer in answers):
            if code is None:
                latencies.append(answered - sent)
                served_after_signout += [
                    "%s: sent %.3f s after the signout reply, answered %.3f s after it, %.3f s before the next "
                    "sign-in was sent" % (account, sent - a, answered - a, b - sent)
                    for a, b in out[account] if a <= sent < b]
                continue
            refused[code] = refused.get(code, 0) + 1
            if code == "reauth_required":
                lost_sessions.update((account, a) for a, b in signed_in[account] if a <= sent < b)
        with open(self.work + "/served-after-signout.txt", "w") as f:
            f.writelines(line + "\n" for line in served_after_signout)
        latencies.sort()
        n = len(latencies)
        p50, p99 = ("%.1f" % (1000 * latencies[min(int(p * n), n - 1)]) if n else "-" for p in (0.5, 0.99))
        sign_ins = sum(1 for a in ACCOUNTS for _, what in self.marks[a] if what == "signin_reply")
        goals = {
            "refresh tokens presented twice": self.gw.log_count("Security - Token invalid"),
            "tokens served after a sign-out": len(served_after_signout),
            "tokens stored after a sign-out": self.counts["stored_after_signout"],
            "sessions lost outside the kill window": len(lost_sessions),
            "crashes": self.counts["crashes"],
        }
        facts = {
            "requests served": len(latencies),
            "latency p50 ms": p50,
            "latency p99 ms": p99,
            "requests refused": " ".join("%s=%d" % kv for kv in sorted(refused.items())) or "none",
            "refreshes the issuer answered": self.gw.log_count("Refresh token generated") - sign_ins,
            "sign-ins": sign_ins,
            "sign-out/sign-in cycles": self.counts["cycles"],
            "kills": "%d (%d as the issuer rotated)" % (self.counts["kills"], self.counts["at_rotation"]),
            "sessions lost in the kill window": self.counts["window"],
            "provider SQL errors": self.gw.log_count("Error executing sql query"),
        }
        for name, value in list(goals.items()) + list(facts.items()):
            print("%s: %s" % (name, value), flush=True)
        return all(v == 0 for v in goals.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seconds", nargs="?", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    ap.add_argument("--bin", required=True, help="the folder holding vaultd")
    ap.add_argument("--clients", type=int, default=int(os.environ.get("SOAK_CLIENTS", 200)))
    ap.add_argument("--kill-seconds", type=float, default=float(os.environ.get("SOAK_KILL_SECONDS", 20)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", time.time())))
    args = ap.parse_args()
    if args.seconds <= 0 or args.clients <= 0 or args.kill_seconds <= 0:
        ap.error("seconds, clients and kill seconds must be positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: through the cleanup below
    work = tempfile.mkdtemp(prefix="soak.")
    soak, passed = Soak(args, work), False
    say("work folder %s; %g s, %d clients, a kill every ~%g s, seed %d"
        % (work, args.seconds, args.clients, args.kill_seconds, args.seed))
    try:
        try:
            soak.setup()
        except (OSError, ValueError, RuntimeError, subprocess.CalledProcessError) as e:
            say("setup failed: %s" % e)
            return 2
        until = soak.run(args.seconds)
        soak.vault.stop()
        passed = soak.report(until)
        return 0 if passed else 1
    except RuntimeError as e:
        say("the soak stopped: %s" % e)
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        soak.stop.set()
        soak.up.set()
        soak.vault.stop()
        soak.gw.stop()
        if passed and os.environ.get("SOAK_KEEP") != "1":
            subprocess.run(["rm", "-rf", work])
        else:
            say("work folder kept: %s" % work)


if __name__ == "__main__":
    sys.exit(main())
