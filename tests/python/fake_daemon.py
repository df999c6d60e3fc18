"""A scripted reaperd control server for the Python client's unit tests.

It listens on a unix socket in a temp dir, records every request line it gets, and answers
each request as `handler(request)` says:
    {"ok": true, ...}   that reply (a dict); a lease that gets {"ok": true} stays open
    b"..."              those raw bytes, then the connection is closed
    CLOSE               close without replying
    SILENT              keep the connection open and never reply
stop() closes the listener and every connection (a daemon that stopped); start() listens
again on the same path. drop_leases() closes the lease connections only.
"""

import json
import os
import select
import socket
import threading
import time

CLOSE = "close"
SILENT = "silent"


def default_handler(request):
    op = request.get("op")
    if op == "status":
        return {"ok": True, "status": {"ready": True, "sessions": []}}
    if op == "metrics":
        return {"ok": True, "metrics": "reaperd_up 1\n"}
    return {"ok": True}


class FakeDaemon:
    def __init__(self, path, handler=default_handler):
        self.path = path
        self.handler = handler
        self.requests = []  # (monotonic time, request dict or raw line)
        self.lease_events = []  # (monotonic time, "open"|"closed", session)
        self._lock = threading.Lock()
        self._leases = []  # sockets of open leases
        self._connections = []
        self._listener = None
        self._wake_r = self._wake_w = None
        self._thread = None

    # ---- control --------------------------------------------------------------------------
    def start(self):
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._listener is None:
            return
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._listener.close()
        self._listener = None
        os.close(self._wake_r)
        os.close(self._wake_w)
        os.unlink(self.path)
        with self._lock:
            connections, self._connections, self._leases = self._connections, [], []
        for conn in connections:
            _shut(conn)

    def drop_leases(self):
        with self._lock:
            leases, self._leases = self._leases, []
        for conn in leases:
            _shut(conn)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- what happened ----------------------------------------------------------------------
    def ops(self):
        with self._lock:
            return [r.get("op") if isinstance(r, dict) else r for _, r in self.requests]

    def request_list(self):
        with self._lock:
            return [r for _, r in self.requests]

    def lease_times(self):
        with self._lock:
            return [t for t, r in self.requests if isinstance(r, dict) and r.get("op") == "lease"]

    def open_leases(self):
        with self._lock:
            return len(self._leases)

    def wait_for(self, condition, limit=10.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.01)
        return condition()

    # ---- the server -------------------------------------------------------------------------
    def _accept_loop(self):
        poller = select.poll()
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            events = dict(poller.poll())
            if self._wake_r in events:
                return
            conn, _ = self._listener.accept()
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        data = b""
        try:
            while b"\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    self._forget(conn)
                    return
                data += chunk
        except OSError:
            self._forget(conn)
            return
        line = data.split(b"\n", 1)[0]
        try:
            request = json.loads(line)
        except ValueError:
            request = line
        with self._lock:
            self.requests.append((time.monotonic(), request))
        answer = self.handler(request)
        if answer == SILENT:
            return  # left open; stop() closes it
        if answer == CLOSE:
            self._forget(conn)
            return
        if isinstance(answer, bytes):
            try:
                conn.sendall(answer)
            except OSError:
                pass
            self._forget(conn)
            return
        is_lease = isinstance(request, dict) and request.get("op") == "lease" and answer.get("ok")
        if is_lease:
            # Registered before the answer goes out: a test that sees the lease held and then
            # calls drop_leases() must find it.
            with self._lock:
                self._leases.append(conn)
                self.lease_events.append((time.monotonic(), "open", request.get("session")))
        conn.sendall((json.dumps(answer) + "\n").encode())
        if is_lease:
            # Wait for the client to close it (or for drop_leases/stop to).
            try:
                while conn.recv(1):
                    pass
            except OSError:
                pass
            with self._lock:
                if conn in self._leases:
                    self._leases.remove(conn)
                self.lease_events.append((time.monotonic(), "closed", request.get("session")))
        self._forget(conn)

    def _forget(self, conn):
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)
        _shut(conn)


def _shut(conn):
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
