"""clients/tokenvault.py against a scripted fake vaultd: hostile replies are
VaultErrors, good ones work, and the command line escapes what it prints.

    python3 -B -m unittest clients/test_tokenvault.py -v
"""
import json, os, shutil, socket, subprocess, sys, tempfile, threading, unittest

sys.dont_write_bytecode = True
CLIENTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, CLIENTS)
import tokenvault  # noqa: E402
from tokenvault import VaultError  # noqa: E402

SCRIPT = os.path.join(CLIENTS, "tokenvault.py")


def line(value):
    return json.dumps(value).encode() + b"\n"


class FakeVaultd:
    """One connection on a Unix socket: reads the request line, writes `reply`
    (bytes), then closes at once when `close` is set, else waits for the
    client to close its end."""

    def __init__(self, folder, reply, close=False):
        self.path = os.path.join(folder, "vaultd.sock")
        self.reply, self.close = reply, close
        self.request = None
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.listener.settimeout(30)  # a safety net only: a test that never connects fails, not hangs
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(30)
            try:
                received = b""
                while not received.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    received += chunk
                self.request = json.loads(received)
                conn.sendall(self.reply)
                if self.close:
                    return
                while conn.recv(65536):  # until the client hangs up
                    pass
            except OSError:  # the client gave up mid-reply (a reply over the limit)
                pass

    def stop(self):
        self.thread.join(30)
        self.listener.close()


class FakeServerCase(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.mkdtemp()
        self.servers = []
        self.addCleanup(shutil.rmtree, self.folder, True)

    def tearDown(self):
        for server in self.servers:
            server.stop()

    def serve(self, reply, close=False):
        if self.servers:  # one socket per test; a second one gets its own folder
            folder = tempfile.mkdtemp(dir=self.folder)
        else:
            folder = self.folder
        server = FakeVaultd(folder, reply, close)
        self.servers.append(server)
        return server


class HostileReplies(FakeServerCase):
    def assertBadReply(self, reply, pattern, close=False, op="token"):
        server = self.serve(reply, close)
        with self.assertRaises(VaultError) as caught:
            if op == "token":
                tokenvault.token("work", path=server.path)
            else:
                tokenvault.call(op, path=server.path)
        self.assertEqual(caught.exception.code, "internal")
        self.assertIsInstance(caught.exception.message, str)
        self.assertRegex(caught.exception.message, pattern)
        return caught.exception

    def test_a_reply_that_is_not_an_object(self):
        for value, kind in [([1], "an array"), ("x", "a string"), (1, "a number"), (1.5, "a number"),
                            (None, "null"), (True, "true/false")]:
            with self.subTest(value=value):
                self.assertBadReply(line(value), f"reply that is {kind}, not a JSON object")

    def test_an_object_without_ok(self):
        self.assertBadReply(line({"id": 1, "access_token": "at-1"}), "'ok' is missing")

    def test_ok_that_is_not_a_bool(self):
        for ok in [1, "true", None, [], {}]:
            with self.subTest(ok=ok):
                self.assertBadReply(line({"id": 1, "ok": ok, "access_token": "at-1"}), "'ok' is .*not true or false")

    def test_a_success_without_an_access_token(self):
        self.assertBadReply(line({"id": 1, "ok": True}), "'access_token' is missing")

    def test_an_access_token_that_is_not_a_string(self):
        for access_token in [1, None, True, ["at-1"], {"a": "b"}, ""]:
            with self.subTest(access_token=access_token):
                self.assertBadReply(line({"id": 1, "ok": True, "access_token": access_token}), "'access_token'")

    def test_an_error_that_is_not_an_object(self):
        for error in ["boom", ["code"], None, 7]:
            with self.subTest(error=error):
                self.assertBadReply(line({"id": 1, "ok": False, "error": error}), "'error' is .*not an object")
        self.assertBadReply(line({"id": 1, "ok": False}), "'error' is missing")

    def test_an_error_whose_code_or_message_is_not_a_string(self):
        for error in [{"code": 1, "message": "m"}, {"code": "internal", "message": None},
                      {"message": "m"}, {"code": "internal"}, {"code": ["x"], "message": {"a": 1}}, {}]:
            with self.subTest(error=error):
                self.assertBadReply(line({"id": 1, "ok": False, "error": error}), "'code' or 'message' is not a string")

    def test_json_nested_deep(self):
        self.assertBadReply(b"[" * 100000 + b"\n", "nested too deep")
        self.assertBadReply(b'{"id":1,"ok":true,"access_token":' + b'{"a":' * 100000 + b"\n", "nested too deep")

    def test_a_line_that_is_not_json(self):
        for reply in [b"{\n", b"\n", b"not json\n", b'{"id":1,"ok":true,"access_token":"at","n":NaN}\n',
                      b'\xef\xbb\xbf{"id":1,"ok":true,"access_token":"at"}\n']:
            with self.subTest(reply=reply[:40]):
                self.assertBadReply(reply, "not JSON")

    def test_bytes_that_are_not_utf8(self):
        self.assertBadReply(b'{"id":1,"ok":true,"access_token":"at-\xff\xfe"}\n', "not UTF-8")
        # json.loads(bytes) would take UTF-16; a vaultd reply is UTF-8 only.
        self.assertBadReply('{"id":1,"ok":true,"access_token":"at-1"}\n'.encode("utf-16"), "not UTF-8|not JSON")

    def test_a_line_over_one_mebibyte(self):
        big = line({"id": 1, "ok": True, "access_token": "a" * (tokenvault.MAX_REPLY_BYTES + 10)})
        self.assertBadReply(big, "longer than 1048576 bytes")
        # No newline at all: the client stops reading at the limit, it does not buffer on.
        self.assertBadReply(b"[" + b" " * (4 * tokenvault.MAX_REPLY_BYTES), "longer than 1048576 bytes")

    def test_a_line_of_exactly_the_limit_is_read(self):
        head = b'{"id":1,"ok":true,"access_token":"'
        padding = tokenvault.MAX_REPLY_BYTES - len(head) - 2
        server = self.serve(head + b"a" * padding + b'"}\n')
        self.assertEqual(tokenvault.token("work", path=server.path), "a" * padding)

    def test_reply_ids_are_compared_by_type(self):
        for reply_id in [True, "1", 1.0, 2, 0, [1], {"id": 1}]:
            with self.subTest(reply_id=reply_id):
                self.assertBadReply(line({"id": reply_id, "ok": True, "access_token": "at-1"}),
                                    "'id' \\(.*\\) is not this request's 1")

    def test_a_reply_without_an_id(self):
        self.assertBadReply(line({"ok": True, "access_token": "at-1"}), "without an 'id'")

    def test_an_object_that_is_neither_reply_nor_event(self):
        self.assertBadReply(line({}), "without an 'id'")
        self.assertBadReply(line({"event": 7}), "without an 'id'")

    def test_a_success_with_id_null(self):
        self.assertBadReply(line({"id": None, "ok": True, "access_token": "at-1"}), "'id' null")

    def test_closed_without_a_reply(self):
        for reply in [b"", b'{"id":1,"ok":true,"access_token":"at-1"}', line({"event": "signed_out", "account": "w"})]:
            with self.subTest(reply=reply):
                error = self.assertBadReply(reply, "closed the connection without a reply", close=True)
                self.assertNotIn("at-1", str(error))

    def test_a_proof_reply_without_a_proof_or_a_dpop_authorization(self):
        for reply in [{"authorization": "DPoP at-1"}, {"dpop": "", "authorization": "DPoP at-1"},
                      {"dpop": ["p"], "authorization": "DPoP at-1"}, {"dpop": "p"},
                      {"dpop": "p", "authorization": "Bearer at-1"}, {"dpop": "p", "authorization": 1}]:
            with self.subTest(reply=reply):
                server = self.serve(line({"id": 1, "ok": True, **reply}))
                with self.assertRaises(VaultError) as caught:
                    tokenvault.dpop_proof("work", "GET", "https://rs.example/", path=server.path)
                self.assertEqual(caught.exception.code, "internal")
                self.assertNotIn("at-1", str(caught.exception))

    def test_messages_never_repeat_the_reply(self):
        error = self.assertBadReply(line({"id": "secret-id", "ok": True, "access_token": "at-secret"}), "'id'")
        self.assertNotIn("secret", str(error))


class GoodReplies(FakeServerCase):
    def test_a_token(self):
        server = self.serve(line({"id": 1, "ok": True, "access_token": "at-1", "token_type": "Bearer",
                                  "expires_at": 1795320027, "expires_in": 3417, "scope": "openid", "new": [1]}))
        self.assertEqual(tokenvault.token("work", min_ttl=120, scope="openid", path=server.path), "at-1")
        self.assertEqual(server.request, {"id": 1, "op": "token", "account": "work", "min_ttl": 120, "scope": "openid"})

    def test_a_dpop_proof(self):
        result = {"dpop": "eyJ.proof.sig", "authorization": "DPoP at-1", "token_type": "DPoP",
                  "expires_at": 1795320027, "expires_in": 3417, "scope": "openid"}
        server = self.serve(line({"id": 1, "ok": True, **result}))
        self.assertEqual(tokenvault.dpop_proof("work", "GET", "https://rs.example/p?q=1", path=server.path), result)
        self.assertEqual(server.request, {"id": 1, "op": "dpop.proof", "account": "work", "htm": "GET",
                                          "htu": "https://rs.example/p?q=1"})
        server = self.serve(line({"id": 1, "ok": True, **result}))
        tokenvault.dpop_proof("work", "POST", "https://rs.example/p", scope="openid", min_ttl=120, path=server.path)
        self.assertEqual(server.request, {"id": 1, "op": "dpop.proof", "account": "work", "htm": "POST",
                                          "htu": "https://rs.example/p", "scope": "openid", "min_ttl": 120})

    def test_a_dpop_nonce(self):
        server = self.serve(line({"id": 1, "ok": True}))
        self.assertIsNone(tokenvault.dpop_nonce("work", "https://rs.example", "n-1", path=server.path))
        self.assertEqual(server.request, {"id": 1, "op": "dpop.nonce", "account": "work",
                                          "origin": "https://rs.example", "nonce": "n-1"})

    def test_any_op_returns_the_reply(self):
        reply = {"id": 1, "ok": True, "protocol": 1, "server": "vaultd", "version": "0.1.0"}
        server = self.serve(line(reply))
        self.assertEqual(tokenvault.call("hello", path=server.path), reply)
        self.assertEqual(server.request, {"id": 1, "op": "hello"})

    def test_the_socket_from_the_environment(self):
        server = self.serve(line({"id": 1, "ok": True, "access_token": "at-env"}))
        saved = os.environ.get("TOKENVAULT_SOCKET")
        os.environ["TOKENVAULT_SOCKET"] = server.path
        try:
            self.assertEqual(tokenvault.token("work"), "at-env")
        finally:
            if saved is None:
                del os.environ["TOKENVAULT_SOCKET"]
            else:
                os.environ["TOKENVAULT_SOCKET"] = saved

    def test_event_lines_are_skipped(self):
        events = line({"event": "token_refreshed", "account": "work", "expires_at": 1}) + \
            line({"event": "signin", "account": "work", "step": "done"})
        server = self.serve(events + line({"id": 1, "ok": True, "access_token": "at-1"}))
        self.assertEqual(tokenvault.token("work", path=server.path), "at-1")

    def test_a_reply_in_pieces_with_crlf(self):
        server = self.serve(b'{"id":1,"ok":tr' + b'ue,"access_token":"at-1"}\r\n')
        self.assertEqual(tokenvault.token("work", path=server.path), "at-1")

    def test_an_error_reply(self):
        server = self.serve(line({"id": 1, "ok": False, "error": {
            "code": "unknown_account", "message": "no account 'nobody'; see vaultctl account list", "extra": 1}}))
        with self.assertRaises(VaultError) as caught:
            tokenvault.token("nobody", path=server.path)
        self.assertEqual(caught.exception.code, "unknown_account")
        self.assertEqual(caught.exception.message, "no account 'nobody'; see vaultctl account list")

    def test_an_error_with_id_null_is_the_daemons_error(self):
        server = self.serve(line({"id": None, "ok": False, "error": {"code": "line_too_long", "message": "too long"}}))
        with self.assertRaises(VaultError) as caught:
            tokenvault.call("status", path=server.path)
        self.assertEqual((caught.exception.code, caught.exception.message), ("line_too_long", "too long"))

    def test_a_daemon_that_never_answers_times_out(self):
        server = self.serve(line({"event": "signed_out", "account": "work"}))
        with self.assertRaises(OSError):
            tokenvault.call("status", path=server.path, timeout=0.3)


class CommandLine(FakeServerCase):
    def run_cli(self, reply, *arguments, socket_path=None):
        if socket_path is None:
            socket_path = self.serve(reply).path
        env = dict(os.environ, TOKENVAULT_SOCKET=socket_path)
        arguments = arguments or ("work",)
        return subprocess.run([sys.executable, "-B", SCRIPT, *arguments], env=env, capture_output=True, timeout=60)

    def assertOneErrorLine(self, result):
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stdout, b"")
        self.assertTrue(result.stderr.startswith(b"tokenvault.py: error: "), result.stderr)
        self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
        self.assertTrue(result.stderr.endswith(b"\n"), result.stderr)
        for control in list(range(0x20)) + [0x7F]:
            if control != 0x0A:
                self.assertNotIn(bytes([control]), result.stderr[:-1])
        text = result.stderr.decode("utf-8")
        for char in text:
            self.assertFalse(0x80 <= ord(char) <= 0x9F or char in "\u2028\u2029\u202e", repr(text))
        self.assertNotIn("Traceback", text)
        return text

    def test_prints_the_token(self):
        result = self.run_cli(line({"id": 1, "ok": True, "access_token": "at-1"}))
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, b"at-1\n", b""))

    def test_an_error_is_one_line_with_the_code(self):
        text = self.assertOneErrorLine(self.run_cli(line({"id": 1, "ok": False, "error": {
            "code": "unknown_account", "message": "no account 'nobody'; see vaultctl account list"}}), "nobody"))
        self.assertEqual(text, "tokenvault.py: error: no account 'nobody'; see vaultctl account list (unknown_account)\n")

    def test_control_characters_are_escaped(self):
        message = "red \x1b[31mtext\x1b[0m\rover\nnext\x07\x08\x7f\x9b2J\x85 \u2028\u202e end"
        text = self.assertOneErrorLine(self.run_cli(line({"id": 1, "ok": False, "error": {
            "code": "unknown_account\x1b]0;title\x07", "message": message}}), "work\x1b[2J"))
        self.assertEqual(
            text,
            "tokenvault.py: error: red \\x1b[31mtext\\x1b[0m\\rover\\nnext\\x07\\x08\\x7f\\x9b2J\\x85 \\u2028\\u202e end"
            " (unknown_account\\x1b]0;title\\x07)\n")

    def test_a_token_with_control_characters_is_not_printed(self):
        text = self.assertOneErrorLine(self.run_cli(line({"id": 1, "ok": True, "access_token": "at-\x1b[2J\n"})))
        self.assertIn("(internal)", text)
        self.assertIn("control characters", text)

    def test_a_hostile_reply_is_an_error_line(self):
        for reply in [line([1]), b"[" * 100000 + b"\n", b"\xff\xfe\n", line({"id": True, "ok": True, "access_token": "a"})]:
            with self.subTest(reply=reply[:20]):
                text = self.assertOneErrorLine(self.run_cli(reply))
                self.assertIn("(internal)", text)

    def test_no_daemon(self):
        text = self.assertOneErrorLine(self.run_cli(None, socket_path=os.path.join(self.folder, "none\x1b[2J.sock")))
        self.assertIn("cannot reach vaultd", text)

    def test_usage(self):
        result = self.run_cli(None, "a", "b", socket_path=os.path.join(self.folder, "none.sock"))
        self.assertEqual((result.returncode, result.stdout, result.stderr), (1, b"", b"usage: tokenvault.py ACCOUNT\n"))


if __name__ == "__main__":
    unittest.main()
