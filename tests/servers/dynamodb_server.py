#!/usr/bin/env python3
"""A DynamoDB-compatible test server: moto's server mode behind a thin wrapper of ours.

moto's server also answers Kinesis, DynamoDB Streams and SQS on the same port (requests are
dispatched by their X-Amz-Target); the event-source tests (tests/tests/every_backend/
poller.rs) use them. The wrapper counts and injects faults into DynamoDB requests only.

Why the wrapper:
- moto's DynamoDB backend takes no lock, so two concurrent conditional PutItems on one
  key can both succeed. The wrapper serializes every DynamoDB request, which makes
  conditional writes atomic as they are on the real service.
- Tests count store round trips. The wrapper counts requests per (table, operation); a
  TransactWriteItems counts once for each table its items name, and takes a fault queued
  for the first of them that has one.
- Tests inject faults (throttling, 500s, lost answers, slow answers) per (table,
  operation), so a fault test touches only its own table.

Control endpoints (JSON), all under /_test/:
  GET  /_test/health                     -> {"ok": true}
  GET  /_test/counts?table=T             -> {"PutItem": 1, ...}
  POST /_test/reset?table=T              -> clears counts and faults of T (a hang already
                                            under way still ends and applies its request)
  POST /_test/faults  {"table": T, "operation": "UpdateItem", "kind": K, "count": 3,
                       "seconds": 5}
       queues `count` faults of kind K for the next requests of that operation on T:
         "throttle"         400 ThrottlingException; the request is not applied
         "internal"         500 InternalServerError; the request is not applied
         "applied_internal" the request is applied by moto (a write happens), then its
                            answer is thrown away and a 500 InternalServerError returned:
                            the write was applied but its answer was lost
         "hang"             the server waits `seconds` (default 5, at most 60) outside the
                            global lock, so other requests, tables and these control
                            endpoints go on meanwhile; then it applies the request and
                            answers normally. A client with a shorter attempt timeout gives
                            up first, and the write lands late.
  POST /_test/strip-old-item?table=T     -> conditional-check failures on T come back
                                            without the old item, as some DynamoDB-compatible
                                            servers answer ReturnValuesOnConditionCheckFailure

A DynamoDB request carrying the header `x-test-uncounted: 1` is neither counted nor
given a queued fault: tests use it to look at a table without disturbing what they measure.

Usage: dynamodb_server.py --port 8000 [--port-file F]
"""

import argparse
import json
import socket
import threading
import time
from collections import defaultdict

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

LOCK = threading.Lock()
COUNTS = defaultdict(lambda: defaultdict(int))  # table -> operation -> n
FAULTS = defaultdict(list)  # (table, operation) -> [{"kind": ..., "seconds": ...}, ...]
STRIP_OLD_ITEM = set()  # tables whose conditional-check failures omit the old item

FAULT_BODIES = {
    "throttle": (
        400,
        {
            "__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException",
            "message": "Rate of requests exceeds the allowed throughput (injected by the test server).",
        },
    ),
    "internal": (
        500,
        {
            "__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
            "message": "Internal server error (injected by the test server).",
        },
    ),
}
# The kinds that reach moto: the request is applied, then answered as the kind says.
APPLIED_KINDS = {"applied_internal", "hang"}
DEFAULT_HANG_SECONDS = 5.0
MAX_HANG_SECONDS = 60.0


def respond(start_response, status, payload, content_type="application/json"):
    body = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}[status]
    start_response(
        f"{status} {reason}",
        [("Content-Type", content_type), ("Content-Length", str(len(body)))],
    )
    return [body]


def query_param(environ, name):
    for pair in environ.get("QUERY_STRING", "").split("&"):
        key, _, value = pair.partition("=")
        if key == name:
            return value
    return None


class Wrapper:
    def __init__(self, app):
        self.app = app

    def control(self, environ, start_response):
        path = environ["PATH_INFO"]
        method = environ["REQUEST_METHOD"]
        if path == "/_test/health":
            return respond(start_response, 200, {"ok": True})
        if path == "/_test/counts" and method == "GET":
            table = query_param(environ, "table") or ""
            with LOCK:
                return respond(start_response, 200, dict(COUNTS.get(table, {})))
        if path == "/_test/reset" and method == "POST":
            table = query_param(environ, "table") or ""
            with LOCK:
                COUNTS.pop(table, None)
                STRIP_OLD_ITEM.discard(table)
                for key in [k for k in FAULTS if k[0] == table]:
                    del FAULTS[key]
            return respond(start_response, 200, {"ok": True})
        if path == "/_test/strip-old-item" and method == "POST":
            with LOCK:
                STRIP_OLD_ITEM.add(query_param(environ, "table") or "")
            return respond(start_response, 200, {"ok": True})
        if path == "/_test/faults" and method == "POST":
            spec = json.loads(read_body(environ) or b"{}")
            kind = spec.get("kind", "throttle")
            if kind not in FAULT_BODIES and kind not in APPLIED_KINDS:
                return respond(start_response, 400, {"error": f"unknown fault kind {kind!r}"})
            fault = {"kind": kind}
            if kind == "hang":
                seconds = float(spec.get("seconds", DEFAULT_HANG_SECONDS))
                if not 0 <= seconds <= MAX_HANG_SECONDS:
                    error = f"hang seconds {seconds} not in 0..{MAX_HANG_SECONDS}"
                    return respond(start_response, 400, {"error": error})
                fault["seconds"] = seconds
            with LOCK:
                queue = FAULTS[(spec["table"], spec["operation"])]
                queue.extend(dict(fault) for _ in range(int(spec.get("count", 1))))
            return respond(start_response, 200, {"ok": True})
        return respond(start_response, 404, {"error": f"no control endpoint {method} {path}"})

    def __call__(self, environ, start_response):
        if environ["PATH_INFO"].startswith("/_test/"):
            return self.control(environ, start_response)
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        operation = target.rpartition(".")[2] if target.startswith("DynamoDB_") else None
        uncounted = environ.get("HTTP_X_TEST_UNCOUNTED") == "1"
        body = read_body(environ)
        tables = [""]
        if operation:
            try:
                tables = request_tables(json.loads(body or b"{}"))
            except ValueError:
                pass
        table = tables[0]
        environ["wsgi.input"] = _Replay(body)
        with LOCK:
            fault = None
            if operation and not uncounted:
                for name in tables:
                    COUNTS[name][operation] += 1
                for name in tables:
                    pending = FAULTS.get((name, operation))
                    if pending:
                        fault = pending.pop(0)
                        break
            if fault is None:
                return self.apply(environ, start_response, table)
            if fault["kind"] in FAULT_BODIES:
                status, payload = FAULT_BODIES[fault["kind"]]
                return respond(start_response, status, payload, "application/x-amz-json-1.0")
            if fault["kind"] == "applied_internal":
                self.apply(environ, lambda *_: None, table)
                status, payload = FAULT_BODIES["internal"]
                return respond(start_response, status, payload, "application/x-amz-json-1.0")
        # "hang": this request's thread (werkzeug runs one per connection) waits without
        # the lock, so every other request and the control endpoints go on meanwhile.
        time.sleep(fault["seconds"])
        with LOCK:
            return self.apply(environ, start_response, table)

    def apply(self, environ, start_response, table):
        """Runs the request through moto and answers it. The caller holds LOCK:
        moto's conditional writes are only atomic under it."""
        if table not in STRIP_OLD_ITEM:
            return list(self.app(environ, start_response))
        captured = {}

        def capture(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers

        body = b"".join(self.app(environ, capture))
        if b"ConditionalCheckFailedException" in body:
            payload = json.loads(body)
            payload.pop("Item", None)
            body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in captured["headers"] if k.lower() not in ("content-length", "x-amz-crc32")]
        start_response(captured["status"], headers + [("Content-Length", str(len(body)))])
        return [body]


def request_tables(request):
    """The tables a DynamoDB request names: its TableName, or for a transaction each
    table its items name, in order, once each ([""] when none)."""
    if "TransactItems" in request:
        tables = []
        for item in request["TransactItems"]:
            for op in item.values():
                name = op.get("TableName", "") if isinstance(op, dict) else ""
                if name not in tables:
                    tables.append(name)
        return tables or [""]
    return [request.get("TableName", "")]


def read_body(environ):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    return environ["wsgi.input"].read(length) if length else b""


class _Replay:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def read(self, size=-1):
        if size is None or size < 0:
            size = len(self.data) - self.pos
        chunk = self.data[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk

    def readline(self, size=-1):
        return self.read(size)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    args = parser.parse_args()

    app = Wrapper(DomainDispatcherApplication(create_backend_app))
    server = make_server(args.host, args.port, app, threaded=True)
    port = server.socket.getsockname()[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os

        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"dynamodb test server listening on http://{args.host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    main()
