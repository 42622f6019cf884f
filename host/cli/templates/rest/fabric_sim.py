#!/usr/bin/env python3
"""A reference fabric simulator: a small REST fabric, and cro's fabric simulator
control protocol (cro-fabric-sim/1) beside it, in one file of standard-library Python.

Copy it and put your own fabric's API where `Fabric API` is: keep the control
protocol as it is, and `cro provider test PROVIDER.wasm --fabric-sim URL` runs the
full conformance suite against your provider, judging it by what this simulator says
is attached, not by what the provider reports.

    python3 fabric_sim.py [--port N]
    # prints: control protocol at http://127.0.0.1:N/sim/

The fabric API (what the provider calls), under /api/v1, with the header
`X-API-Key: <key>` (the key is in the Secret the hello names):

    GET    /api/v1/machines/{machine}/devices        {"devices": [device, ...]}
    POST   /api/v1/machines/{machine}/devices        {"type", "model"} + Idempotency-Key
           201 device attached, 202 device attaching, 409 NO_CAPACITY
           (the same Idempotency-Key again answers with the same device)
    DELETE /api/v1/machines/{machine}/devices/{id}   204 detached, 202 detaching,
                                                     404 NOT_ATTACHED
    GET    /api/v1/devices/{id}                      device, 404 NOT_FOUND
    GET    /api/v1/free                              {"free": [{"type", "model", "count"}]}
           (devices nobody holds; any machine of the fabric can take any of them)

    device: {"id", "serial", "type": "gpu"|"cxlmemory", "model", "machine",
             "state": "attaching"|"attached"|"detaching", "health": "ok"|"warning"}
    error:  {"error": {"code", "message"}}

Nodes map to machines through `spec.providerID: restfabric://<machine>`.
"""

import argparse
import json
import re
import secrets
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL = "cro-fabric-sim/1"
SECRET = {"namespace": "cro-system", "name": "restfabric-credentials"}
PROVIDER_ID_PREFIX = "restfabric://"
DEFAULT_MODELS = {"gpu": "A100 80GB", "cxlmemory": "CXL 256GiB"}


class State:
    """Everything the fabric holds; one lock guards it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.api_key = secrets.token_hex(16)
        self.machines = {}  # machine id -> node name
        self.free = []  # devices nobody holds
        self.held = {}  # device id -> device (with machine, state, due)
        self.keys = {}  # (machine, idempotency key) -> device id
        self.faults = []  # {"op", "kind", "delay_ms"}, each used once
        self.slow_ms = 0
        self.count = 0
        self.received = []  # every fabric API request: the oracle of calls

    def settle(self):
        """Moves attaching and detaching devices on once their time has come."""
        now = time.monotonic()
        for dev_id, dev in list(self.held.items()):
            if dev["state"] == "attaching" and now >= dev["due"]:
                dev["state"] = "attached"
            elif dev["state"] == "detaching" and now >= dev["due"]:
                self.release(dev_id)

    def release(self, dev_id):
        dev = self.held.pop(dev_id)
        self.keys = {k: v for k, v in self.keys.items() if v != dev_id}
        self.free.append({k: dev[k] for k in ("id", "serial", "type", "model")})

    def take_fault(self, op):
        for i, f in enumerate(self.faults):
            if f["op"] in (op, "any"):
                return self.faults.pop(i)
        return None


STATE = State()


def public(dev):
    return {k: dev[k] for k in ("id", "serial", "type", "model", "machine", "state", "health")}


def error(code, message):
    return {"error": {"code": code, "message": message}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the suite reads stdout
        pass

    def setup(self):
        super().setup()
        # Headers and body go out as separate writes: without this, Nagle's algorithm
        # and the client's delayed ACK hold each reply ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # ---- plumbing ----

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def reply(self, status, value=None, cut=False):
        data = b"" if value is None else json.dumps(value).encode()
        if cut:
            data = data[: len(data) // 2]
        try:
            self.send_response(status)
            if value is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up waiting (a call past its deadline): nothing to answer.
            self.close_connection = True

    def drop(self):
        """Closes the connection without a reply."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_PUT(self):
        self.route("PUT")

    def do_DELETE(self):
        self.route("DELETE")

    def route(self, method):
        path = self.path.split("?", 1)[0]
        if path.startswith("/sim/") or path == "/sim":
            return self.control(method, path[len("/sim"):].strip("/"))
        if path.startswith("/api/v1/"):
            return self.fabric(method, path[len("/api/v1/"):])
        self.reply(404, error("NOT_FOUND", f"no route {method} {path}"))

    # ---- the control protocol (keep as it is) ----

    def control(self, method, path):
        body = self.body()
        if body is None:
            return self.reply(400, {"error": "the body is not JSON"})
        with STATE.lock:
            STATE.settle()
            if (method, path) == ("GET", ""):
                return self.reply(200, self.hello())
            if (method, path) == ("POST", "reset"):
                STATE.reset()
                return self.reply(204)
            if (method, path) == ("POST", "machines"):
                STATE.count += 1
                machine = f"machine-{STATE.count:04d}"
                STATE.machines[machine] = body["node"]
                node = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": body["node"]},
                    "spec": {"providerID": PROVIDER_ID_PREFIX + machine},
                }
                return self.reply(200, {"machine": machine, "objects": [node]})
            if (method, path) == ("POST", "devices"):
                kind = body.get("type")
                if kind not in DEFAULT_MODELS:
                    return self.reply(400, {"error": f"unknown device type {kind!r}"})
                model = body.get("model") or DEFAULT_MODELS[kind]
                for _ in range(int(body.get("count", 1))):
                    STATE.count += 1
                    STATE.free.append({
                        "id": f"dev-{STATE.count:04d}",
                        "serial": f"{kind.upper()}-{uuid.uuid4()}",
                        "type": kind,
                        "model": model,
                    })
                return self.reply(200, {"model": model})
            if (method, path) == ("POST", "faults"):
                if body.get("op") not in ("attach", "detach", "any") or body.get("kind") not in (
                    "server-error", "malformed-body", "lost-request", "lost-reply", "slow"):
                    return self.reply(400, {"error": f"unknown fault {body!r}"})
                if body["kind"] == "slow" and not isinstance(body.get("delay_ms"), int):
                    return self.reply(400, {"error": "a slow fault needs delay_ms"})
                STATE.faults.append(body)
                return self.reply(204)
            if (method, path) == ("DELETE", "faults"):
                STATE.faults.clear()
                return self.reply(204)
            m = re.fullmatch(r"machines/([^/]+)/devices", path)
            if method == "GET" and m:
                devices = [
                    {"ids": [d["id"], d["serial"]], "ready": d["state"] == "attached"}
                    for d in STATE.held.values()
                    if d["machine"] == m.group(1)
                ]
                return self.reply(200, {"devices": devices})
            if (method, path) == ("PUT", "slow"):
                STATE.slow_ms = body.get("delay_ms") or 0
                return self.reply(204)
            if (method, path) == ("PUT", "health"):
                if body.get("health") not in ("ok", "warning"):
                    return self.reply(400, {"error": f"unknown health {body.get('health')!r}"})
                for d in STATE.held.values():
                    if body.get("device") in (d["id"], d["serial"]):
                        d["health"] = body["health"]
                        return self.reply(204)
                return self.reply(404, {"error": f"no device {body.get('device')!r} is attached"})
            if (method, path) == ("GET", "requests"):
                return self.reply(200, {"requests": STATE.received})
            if (method, path) == ("GET", "free"):
                query = urllib.parse.parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
                kind, model = query.get("type", [None])[0], query.get("model", [None])[0]
                if kind not in DEFAULT_MODELS or model is None:
                    return self.reply(400, {"error": f"free wants ?type=gpu|cxlmemory&model=..., got {query!r}"})
                count = sum(1 for d in STATE.free if d["type"] == kind and d["model"] == model)
                return self.reply(200, {"count": count})
            if (method, path) == ("POST", "jobs/fail-next"):
                return self.reply(501, {"error": "this fabric attaches without jobs"})
        self.reply(404, {"error": f"no control call {method} /{path}"})

    def hello(self):
        host, port = self.server.server_address[:2]
        origin = f"http://{host}:{port}"
        return {
            "protocol": PROTOCOL,
            "fabric": "restfabric",
            "config": {"endpoint": f"{origin}/api/"},
            "grants": {
                "http": [{"url": origin}],
                "secret": dict(SECRET, keys=["api_key"]),
                "lookup": [{"api_version": "v1", "kind": "Node"}],
            },
            "secret": dict(SECRET, data={"api_key": STATE.api_key}),
            "jobs": False,
        }

    # ---- the fabric API (replace with your own) ----

    def fabric(self, method, path):
        op = "any"
        if method == "POST" and re.fullmatch(r"machines/[^/]+/devices", path):
            op = "attach"
        elif method == "DELETE" and re.fullmatch(r"machines/[^/]+/devices/[^/]+", path):
            op = "detach"
        body = self.body()
        with STATE.lock:
            STATE.received.append({
                "seq": len(STATE.received) + 1,
                "method": method,
                "path": "/api/v1/" + path,
                "changes": op in ("attach", "detach"),
            })
            fault = STATE.take_fault(op)
        kind = fault["kind"] if fault else None
        if kind == "slow":
            time.sleep(fault["delay_ms"] / 1000)
        if kind == "lost-request":
            return self.drop()
        if kind == "server-error":
            return self.reply(503, error("UNAVAILABLE", "the fabric is busy"))
        if self.headers.get("X-API-Key") != STATE.api_key:
            return self.reply(401, error("UNAUTHORIZED", "a valid X-API-Key is required"))
        if body is None:
            return self.reply(400, error("BAD_REQUEST", "the body is not JSON"))
        with STATE.lock:
            STATE.settle()
            status, value = self.act(method, path, body)
        if kind == "lost-reply":
            return self.drop()
        self.reply(status, value, cut=(kind == "malformed-body" and value is not None))

    def act(self, method, path, body):
        m = re.fullmatch(r"machines/([^/]+)/devices(?:/([^/]+))?", path)
        if m:
            machine, dev_id = m.group(1), m.group(2)
            if machine not in STATE.machines:
                return 404, error("NO_SUCH_MACHINE", f"no machine {machine}")
            if method == "GET" and dev_id is None:
                mine = [public(d) for d in STATE.held.values() if d["machine"] == machine]
                return 200, {"devices": mine}
            if method == "POST" and dev_id is None:
                return self.attach(machine, body)
            if method == "DELETE" and dev_id is not None:
                return self.detach(machine, dev_id)
        if (method, path) == ("GET", "free"):
            counts = {}
            for d in STATE.free:
                counts[(d["type"], d["model"])] = counts.get((d["type"], d["model"]), 0) + 1
            free = [{"type": t, "model": m, "count": n} for (t, m), n in sorted(counts.items())]
            return 200, {"free": free}
        m = re.fullmatch(r"devices/([^/]+)", path)
        if m and method == "GET":
            dev = STATE.held.get(m.group(1))
            if dev is None:
                return 404, error("NOT_FOUND", f"no device {m.group(1)} is attached")
            return 200, public(dev)
        return 404, error("NOT_FOUND", f"no route {method} /api/v1/{path}")

    def attach(self, machine, body):
        key = self.headers.get("Idempotency-Key")
        if key and (machine, key) in STATE.keys:
            dev = STATE.held[STATE.keys[(machine, key)]]
            return (201 if dev["state"] == "attached" else 202), public(dev)
        kind, model = body.get("type"), body.get("model")
        for i, dev in enumerate(STATE.free):
            if dev["type"] == kind and dev["model"] == model:
                dev = STATE.free.pop(i)
                slow = STATE.slow_ms > 0
                dev.update(
                    machine=machine,
                    health="ok",
                    state="attaching" if slow else "attached",
                    due=time.monotonic() + STATE.slow_ms / 1000,
                )
                STATE.held[dev["id"]] = dev
                if key:
                    STATE.keys[(machine, key)] = dev["id"]
                return (202 if slow else 201), public(dev)
        return 409, error("NO_CAPACITY", f"no free {kind} of model {model!r}")

    def detach(self, machine, dev_id):
        dev = STATE.held.get(dev_id)
        if dev is None or dev["machine"] != machine:
            return 404, error("NOT_ATTACHED", f"device {dev_id} is not attached to {machine}")
        if dev["state"] == "detaching":
            return 202, public(dev)
        if STATE.slow_ms > 0:
            dev.update(state="detaching", due=time.monotonic() + STATE.slow_ms / 1000)
            return 202, public(dev)
        STATE.release(dev_id)
        return 204, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"control protocol at http://127.0.0.1:{server.server_address[1]}/sim/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
