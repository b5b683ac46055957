"""A stand-in model server for traffic tests: takes vLLM's flags (the operator rewrites them for the canary), answers
GET /health with 200 and every other request with JSON saying which workload answered: the KV cache dtype it was
started with (the canary's is fp8_*, the baseline's "auto") and its address. Run as a pod's container by the kubelet
harness (tests/support/kubelet.py), which appends `--host POD_IP`; standard library only, starts in well under a
second, so a traffic test needs no model.
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="")
    parser.add_argument("--kv-cache-dtype", default="auto")
    args, _ = parser.parse_known_args()
    answer = json.dumps(
        {"kv_cache_dtype": args.kv_cache_dtype, "model": args.model, "address": f"{args.host}:{args.port}"}
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the gateway reuses its connections to the pod

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            body = b"ok" if self.path == "/health" else answer
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply

        def log_message(self, format: str, *args: object) -> None:
            return None

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
