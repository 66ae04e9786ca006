#!/usr/bin/env python3
"""A stand-in for a Kubernetes API server, for kubectl in the tests.

Serves HTTPS on 127.0.0.1 with the given certificate and accepts exactly one
bearer token (read from --token-file at each request, so the test can change
it): every GET answers 200 with a small JSON body naming the path, anything
else 401. Writes its port to --port-file once it listens.
"""
import argparse
import http.server
import json
import ssl


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with open(args.token_file) as f:
                expected = "Bearer " + f.read().strip()
            if self.headers.get("Authorization") != expected:
                self.answer(401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401})
                return
            self.answer(200, {"accepted": True, "path": self.path})

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
