"""The reaperd control protocol, client side (docs/control-protocol.md).

One JSON object per line over a unix stream socket. Every call opens its own connection; a
lease keeps its connection open for as long as it is held. Standard library only.
"""

import json
import logging
import os
import select
import socket
import stat
import threading
import time

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "MAX_MESSAGE_BYTES",
    "MAX_REPLY_BYTES",
    "ControlError",
    "DaemonUnreachable",
    "ErrorReply",
    "ProtocolViolation",
    "WaitTimeout",
    "Client",
    "Lease",
    "socket_path_from_environment",
    "validate_session_id",
    "validate_container",
]

DEFAULT_SOCKET_PATH = "/run/reaperd/control.sock"
MAX_MESSAGE_BYTES = 64 * 1024  # a request line, the newline excluded
MAX_REPLY_BYTES = 16 * 1024 * 1024  # status and metrics replies can be large
MAX_SESSION_ID_BYTES = 256
MAX_CONTAINER_BYTES = 256
DEFAULT_TIMEOUT = 2.0  # seconds, for one exchange (connect, send, reply)

_log = logging.getLogger("reaperd")


class ControlError(Exception):
    """A failure to talk to the daemon: unreachable, timed out, garbled or error reply."""


class DaemonUnreachable(ControlError):
    """No daemon answered: the socket is missing, refused, or the exchange timed out or broke."""


class ErrorReply(ControlError):
    """The daemon answered {"ok":false,...}; the message is its error.

    `reply` is the whole reply, a dict: a refused orphan report names the container it
    resolved to ("container", "name") and whether reaperd owns it ("owned").
    """

    def __init__(self, message, reply=None):
        super().__init__(message)
        self.reply = reply if reply is not None else {"ok": False, "error": message}


class WaitTimeout(ControlError):
    """end(wait=True) timed out with something of the session left.

    `session` is the session, `reply` reaperd's last answer about it (a dict with
    "remaining", by kind), or None if it never answered.
    """

    def __init__(self, message, session, reply):
        super().__init__(message)
        self.session = session
        self.reply = reply


class ProtocolViolation(ValueError):
    """An argument the protocol does not allow (raised before connecting)."""


def socket_path_from_environment(uid=None, environ=None, exists=None):
    """Where reaperd is, by the rule of the C++ library (lib/src/user_defaults.hpp).

    $REAPERD_SOCKET if set and non-empty; else, for root, /run/reaperd/control.sock (the
    system daemon's); else, for any other user, their own daemon's
    $XDG_RUNTIME_DIR/reaperd/control.sock if that socket exists, then
    /run/reaperd/control.sock if that one does, else the user's own path (so that a
    connection error names it). A relative XDG_RUNTIME_DIR counts as unset. uid, environ
    and exists (a path -> bool probe) default to the process's own.
    """
    uid = os.geteuid() if uid is None else uid
    environ = os.environ if environ is None else environ
    exists = _is_socket if exists is None else exists
    if environ.get("REAPERD_SOCKET"):
        return environ["REAPERD_SOCKET"]
    candidates = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if uid != 0 and runtime.startswith("/"):
        candidates.append(runtime + "/reaperd/control.sock")
    candidates.append(DEFAULT_SOCKET_PATH)
    for candidate in candidates:
        if exists(candidate):
            return candidate
    return candidates[0]


def _is_socket(path):
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _validate_token(what, value, max_bytes):
    if not isinstance(value, str):
        raise ProtocolViolation(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise ProtocolViolation(f"{what} is empty")
    data = value.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise ProtocolViolation(f"{what} is {len(data)} bytes long; the limit is {max_bytes}")
    for i, byte in enumerate(data):
        if byte <= 0x20 or byte >= 0x7F:
            raise ProtocolViolation(
                f"{what} {json.dumps(value)} has a space, control or non-ASCII character at "
                f"byte {i}; only printable ASCII is allowed")


def validate_session_id(session):
    """1 to 256 bytes of printable ASCII without spaces; raises ProtocolViolation."""
    _validate_token("session id", session, MAX_SESSION_ID_BYTES)


def validate_container(container):
    """A container id or name: the same rules as a session id."""
    _validate_token("container", container, MAX_CONTAINER_BYTES)


class _Cancelled(Exception):
    """A Lease was stopped while its attempt waited for the daemon."""


class _Connection:
    """One connection to the daemon with one deadline for everything done on it."""

    def __init__(self, path, timeout):
        self.path = path
        self.deadline = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec (PEP 446)
        try:
            self.sock.settimeout(self._remaining())
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise DaemonUnreachable(f"cannot reach reaperd at {path}: {_os_error_text(e)}") from None
        except BaseException:
            self.sock.close()
            raise

    def close(self):
        self.sock.close()

    def _failure(self, what):
        return f"talking to reaperd at {self.path}: {what}"

    def _remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DaemonUnreachable(self._failure("timed out"))
        return left

    def _send(self, data):
        try:
            self.sock.settimeout(self._remaining())
            self.sock.sendall(data)
        except socket.timeout:
            raise DaemonUnreachable(self._failure("timed out sending the request")) from None
        except OSError as e:
            raise DaemonUnreachable(self._failure(_os_error_text(e))) from None

    def _wait_readable(self, cancel_fd):
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        if cancel_fd is not None:
            poller.register(cancel_fd, select.POLLIN)
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise DaemonUnreachable(self._failure("timed out waiting for the reply"))
            for fd, _ in poller.poll(max(1, int(left * 1000 + 0.999))):
                if fd == cancel_fd:
                    raise _Cancelled()
                return

    def _receive_line(self, cancel_fd):
        line = bytearray()
        while True:
            self._wait_readable(cancel_fd)
            try:
                self.sock.settimeout(0)
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as e:
                raise DaemonUnreachable(self._failure(_os_error_text(e))) from None
            if not chunk:
                raise DaemonUnreachable(self._failure(
                    "the daemon closed the connection without a reply" if not line
                    else "the daemon closed the connection in the middle of a reply"))
            end = chunk.find(b"\n")
            line += chunk if end < 0 else chunk[:end]
            if len(line) > MAX_REPLY_BYTES:
                raise ControlError(self._failure(f"reply longer than {MAX_REPLY_BYTES} bytes"))
            if end >= 0:
                return bytes(line)

    def exchange(self, request, cancel_fd=None):
        """Sends one request (a dict) and returns its reply (a dict with "ok": true)."""
        data = (json.dumps(request, separators=(",", ":"), ensure_ascii=True) + "\n").encode()
        try:
            self._send(data)
            line = self._receive_line(cancel_fd)
        except DaemonUnreachable:
            # A daemon that refuses a connection (too many connections) answers and closes
            # before the request is written; its reply says more than "broken pipe".
            try:
                line = self._receive_line(cancel_fd)
            except ControlError:
                line = b""
            if not line:
                raise
        reply = _parse_reply(line, self._failure)
        if not reply["ok"]:
            raise ErrorReply(f"reaperd refused {request['op']}: {reply.get('error', '')}", reply)
        return reply


def nothing_remains(reply):
    """True for a session reply saying nothing of the session is left: reaperd is ready (it
    has listed the engine) and every count in "remaining" is 0."""
    remaining = reply.get("remaining")
    return (reply.get("ok") is True and reply.get("ready") is True and isinstance(remaining, dict)
            and all(n == 0 for n in remaining.values()))


def _parse_reply(line, failure):
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        reply = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ControlError(failure(f"garbled reply: reply is not valid JSON: {e}")) from None
    if not isinstance(reply, dict):
        raise ControlError(failure("garbled reply: reply is not a JSON object"))
    if not isinstance(reply.get("ok"), bool):
        raise ControlError(failure('garbled reply: reply has no boolean "ok" field'))
    if not reply["ok"] and not isinstance(reply.get("error"), str):
        raise ControlError(failure('garbled reply: an error reply needs an "error" string'))
    return reply


def _os_error_text(error):
    if isinstance(error, socket.timeout):
        return "timed out"
    return error.strerror or str(error)


class Client:
    """The client side of the control protocol.

    socket_path: the daemon's socket; None means $REAPERD_SOCKET or /run/reaperd/control.sock.
    timeout: seconds for one exchange. Calls raise DaemonUnreachable when no daemon answers,
    ErrorReply on {"ok":false}, ControlError on a garbled reply and ProtocolViolation (a
    ValueError) for an invalid argument, before connecting.
    """

    def __init__(self, socket_path=None, timeout=DEFAULT_TIMEOUT):
        self.socket_path = socket_path or socket_path_from_environment()
        self.timeout = timeout

    def __repr__(self):
        return f"reaperd.Client({self.socket_path!r})"

    def _call(self, request):
        connection = _Connection(self.socket_path, self.timeout)
        try:
            return connection.exchange(request)
        finally:
            connection.close()

    def end(self, session, wait=False, timeout=300.0, poll_interval=0.1):
        """Ends the session: reaperd reaps its containers now (then its networks and volumes).

        Returns the reply, a dict: "known" (reaperd knew the session), "already_ended",
        "dry_run" and "reaps_queued" (by kind: {"containers": 3, ...}); an older reaperd
        answers only {"ok": True}. With wait=True, returns once reaperd sees nothing of the
        session left, asking every poll_interval seconds (and on while reaperd restarts), or
        raises WaitTimeout after `timeout` seconds.
        """
        validate_session_id(session)
        reply = self._call({"op": "end", "session": session})
        if wait:
            self.wait_until_gone(session, timeout, poll_interval)
        return reply

    def session(self, session):
        """What reaperd still sees of the session, a dict: "known", "state", "ready" and
        "remaining" (by kind: {"containers": 1, "networks": 0, "volumes": 0})."""
        validate_session_id(session)
        return self._call({"op": "session", "session": session})

    def wait_until_gone(self, session, timeout=300.0, poll_interval=0.1):
        """Returns reaperd's answer once nothing of the session is left (ready, and every
        count in "remaining" 0); raises WaitTimeout after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                last = self.session(session)
                if nothing_remains(last):
                    return last
            except DaemonUnreachable:
                pass  # a restart of reaperd: its sessions and reaps survive it
            except ErrorReply as e:
                if 'unknown op "session"' in str(e):
                    raise ErrorReply(f"reaperd at {self.socket_path} is too old to say what is "
                                     "left of a session; cannot wait for it", e.reply) from None
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(poll_interval, left))
        if last is None:
            what = "reaperd did not answer"
        elif not last.get("ready"):
            what = "reaperd has not listed the engine yet"
        else:
            what = ", ".join(f"{n} {kind[:-1] if n == 1 and kind.endswith('s') else kind}"
                             for kind, n in sorted(last.get("remaining", {}).items()) if n)
            what += " still there"
        raise WaitTimeout(f"session {session}: timed out after {timeout}s: {what}", session, last)

    def orphan(self, container, session=None):
        """Asks reaperd to reap one container now (it does so only if it owns it by label).

        Returns the reply, a dict: "container" (the full id the report was pinned to),
        "name", "session" (its owner), "owned", "queued" and "dry_run". A refusal raises
        ErrorReply, whose .reply says the same of the container it resolved to.
        """
        validate_container(container)
        request = {"op": "orphan", "container": container}
        if session is not None:
            validate_session_id(session)
            request["session"] = session
        return self._call(request)

    def status(self, ended=False, limit=None):
        """The daemon's status object (a dict; its fields may grow).

        By default "sessions" holds the live sessions and the newest few ended ones
        ("ended_sessions" counts them all); ended=True lists only the ended ones, newest
        first, at most `limit` (the daemon's default when None).
        """
        request = {"op": "status"}
        if ended:
            request["ended"] = True
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise ValueError(f"limit must be a non-negative integer, not {limit!r}")
            request["limit"] = limit
        reply = self._call(request)
        status = reply.get("status")
        if not isinstance(status, dict):
            raise ControlError(f"talking to reaperd at {self.socket_path}: "
                               'garbled reply: a status reply needs a "status" object')
        return status

    def metrics(self):
        """The daemon's metrics, Prometheus text exposition format."""
        reply = self._call({"op": "metrics"})
        metrics = reply.get("metrics")
        if not isinstance(metrics, str):
            raise ControlError(f"talking to reaperd at {self.socket_path}: "
                               'garbled reply: a metrics reply needs a "metrics" string')
        return metrics

    def lease(self, session, **options):
        """A Lease on the session (a context manager; see Lease)."""
        return Lease(session, client=self, **options)

    def _open_lease(self, session, cancel_fd=None):
        """Takes a lease; returns its connected socket (the caller owns it)."""
        connection = _Connection(self.socket_path, self.timeout)
        try:
            connection.exchange({"op": "lease", "session": session}, cancel_fd)
        except BaseException:
            connection.close()
            raise
        connection.sock.settimeout(None)
        return connection.sock


# What a Lease tells its observer.
LOST = "lost"  # the daemon closed the lease's connection (stopped, restarted, killed)
FAILING = "failing"  # an attempt to take the lease failed; once per run of failures
TAKEN = "taken"  # the background thread took the lease (again)


def _log_events(lease, event, error):
    if event == LOST:
        _log.warning("reaperd closed the lease on %s; reconnecting to %s",
                     lease.session, lease.client.socket_path)
    elif event == FAILING:
        _log.warning("taking the lease on %s: %s", lease.session, error)
    elif event == TAKEN:
        _log.info("lease on %s restored", lease.session)


class Lease:
    """Keeps a lease on one session while it is held, across daemon restarts.

    reaperd closes every lease when it stops or restarts and gives the sessions that held one
    a fresh lease_grace to come back; a Lease comes back on its own. start() makes the first
    attempt on the calling thread, then a daemon thread keeps the lease: when its connection
    closes it reconnects after first_retry seconds, then with doubling waits capped at
    max_retry, for as long as the Lease runs. stop() (or leaving the `with` block) releases
    it within milliseconds, whatever the thread is doing.

    As a context manager, a daemon that answers and refuses the lease raises ErrorReply;
    an unreachable daemon raises DaemonUnreachable when required=True, otherwise the block
    runs anyway (a warning is logged) while the thread keeps trying, as `reaperctl run` does.

    on_event(lease, event, error) is called on the thread for LOST, FAILING (with the error)
    and TAKEN; the default logs them to the "reaperd" logger.
    """

    def __init__(self, session, socket_path=None, *, client=None, required=False,
                 timeout=DEFAULT_TIMEOUT, first_retry=0.1, max_retry=1.0, on_event=_log_events):
        validate_session_id(session)
        self.session = session
        self.client = client or Client(socket_path, timeout)
        self.required = required
        self.first_retry = first_retry
        self.max_retry = max_retry
        self.on_event = on_event
        self._lock = threading.Lock()
        self._sock = None
        self._thread = None
        self._stopping = threading.Event()
        self._cancel_read, self._cancel_write = os.pipe()  # readable once stop() was called
        self._started = False

    def __repr__(self):
        return f"reaperd.Lease({self.session!r}, holds={self.holds()})"

    def start(self):
        """Makes the first attempt here, then starts the thread that keeps the lease.

        Returns the first attempt's error (a ControlError), or None when the lease is held;
        the thread keeps trying either way.
        """
        if self._started:
            raise RuntimeError("Lease.start() called twice")
        self._started = True
        error = None
        try:
            sock = self.client._open_lease(self.session)
            with self._lock:
                self._sock = sock
        except ControlError as e:
            error = e
        self._thread = threading.Thread(target=self._run, name=f"reaperd-lease-{self.session}",
                                        daemon=True)
        self._thread.start()
        return error

    def holds(self):
        """True while the lease is held and its connection is open (checked now)."""
        with self._lock:
            sock = self._sock
            if sock is None or self._stopping.is_set():
                return False
            return not _closed_by_peer(sock)

    def stop(self):
        """Releases the lease and stops the thread. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        try:
            os.write(self._cancel_write, b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        for fd in (self._cancel_read, self._cancel_write):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        error = self.start()
        if error is not None and (self.required or isinstance(error, ErrorReply)):
            self.stop()
            raise error
        if error is not None:
            _log.warning("no lease on %s yet (%s); going on and retrying in the background",
                         self.session, error)
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass

    # ---- the thread --------------------------------------------------------------------

    def _tell(self, event, error=None):
        if self.on_event is None:
            return
        try:
            self.on_event(self, event, error)
        except Exception:
            pass

    def _wait(self, seconds):
        """Sleeps; False when stop() was called meanwhile."""
        return not self._stopping.wait(seconds)

    def _run(self):
        delay = self.first_retry
        with self._lock:
            retry = self._sock is None  # start()'s attempt failed: retry after first_retry
        failing = retry
        while not self._stopping.is_set():
            with self._lock:
                sock = self._sock
            if sock is None:
                if retry and not self._wait(delay):
                    return
                try:
                    sock = self.client._open_lease(self.session, self._cancel_read)
                except _Cancelled:
                    return
                except ControlError as e:
                    if not failing:
                        failing = True
                        self._tell(FAILING, e)
                    if retry:
                        delay = min(delay * 2, self.max_retry)
                    retry = True
                    continue
                with self._lock:
                    if self._stopping.is_set():
                        sock.close()
                        return
                    self._sock = sock
                failing = False
                delay = self.first_retry
                self._tell(TAKEN)
            # Held: wait until the daemon closes the connection or stop() is called.
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            poller.register(self._cancel_read, select.POLLIN)
            events = dict(poller.poll())
            if self._cancel_read in events or self._stopping.is_set():
                return
            with self._lock:
                self._sock = None
            sock.close()
            self._tell(LOST)
            retry = True  # the first attempt after first_retry, then doubling waits


def _closed_by_peer(sock):
    """True when the daemon closed the connection (or sent anything, which ends a lease)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))
