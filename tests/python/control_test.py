"""The Python client's protocol and lease keeper against a fake control server."""

import logging
import os
import tempfile
import threading
import time

import pytest

import reaperd
from reaperd import control
from fake_daemon import CLOSE, SILENT, FakeDaemon, default_handler


@pytest.fixture
def sock_dir():
    with tempfile.TemporaryDirectory(prefix="reaperd-pytest.") as d:
        yield d


@pytest.fixture
def daemon(sock_dir):
    with FakeDaemon(os.path.join(sock_dir, "control.sock")) as d:
        yield d


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def test_version_is_the_projects():
    assert reaperd.__version__ == os.environ["REAPER_VERSION"]


def test_requests_are_one_json_line_each_with_exactly_the_ops_fields(daemon):
    client = reaperd.Client(daemon.path)
    client.end("build-1")
    client.orphan("c0ffee", session="build-1")
    client.orphan("c0ffee")
    assert client.status() == {"ready": True, "sessions": []}
    assert client.metrics() == "reaperd_up 1\n"
    assert daemon.request_list() == [
        {"op": "end", "session": "build-1"},
        {"op": "orphan", "container": "c0ffee", "session": "build-1"},
        {"op": "orphan", "container": "c0ffee"},
        {"op": "status"},
        {"op": "metrics"},
    ]


def test_status_asks_for_ended_sessions_and_a_limit_only_when_given(daemon):
    client = reaperd.Client(daemon.path)
    client.status(ended=True, limit=5)
    client.status(limit=0)
    assert daemon.request_list() == [
        {"op": "status", "ended": True, "limit": 5},
        {"op": "status", "limit": 0},
    ]
    for bad in (-1, True, "5"):
        with pytest.raises(ValueError):
            client.status(limit=bad)


def test_module_functions_use_reaperd_socket_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("REAPERD_SOCKET", daemon.path)
    reaperd.end("s1")
    reaperd.orphan("c1", "s1")
    assert reaperd.status()["ready"] is True
    assert daemon.ops() == ["end", "orphan", "status"]


def test_the_default_socket_path(monkeypatch):
    monkeypatch.delenv("REAPERD_SOCKET", raising=False)
    assert reaperd.Client().socket_path == "/run/reaperd/control.sock"
    monkeypatch.setenv("REAPERD_SOCKET", "")
    assert reaperd.socket_path_from_environment() == "/run/reaperd/control.sock"


@pytest.mark.parametrize("uid, environ, present, expected", [
    (1000, {"REAPERD_SOCKET": "/tmp/x.sock", "XDG_RUNTIME_DIR": "/r"}, {"/r/reaperd/control.sock"}, "/tmp/x.sock"),
    (1000, {"REAPERD_SOCKET": "", "XDG_RUNTIME_DIR": "/r"}, {"/r/reaperd/control.sock"}, "/r/reaperd/control.sock"),
    (1000, {"XDG_RUNTIME_DIR": "/r"}, {"/r/reaperd/control.sock", "/run/reaperd/control.sock"},
     "/r/reaperd/control.sock"),
    # No user daemon: the system one, which control.group may open to this user.
    (1000, {"XDG_RUNTIME_DIR": "/r"}, {"/run/reaperd/control.sock"}, "/run/reaperd/control.sock"),
    # Neither: the user's own, so the connection error names it.
    (1000, {"XDG_RUNTIME_DIR": "/r"}, set(), "/r/reaperd/control.sock"),
    (1000, {"XDG_RUNTIME_DIR": "r"}, {"r/reaperd/control.sock"}, "/run/reaperd/control.sock"),
    (1000, {}, set(), "/run/reaperd/control.sock"),
    (0, {"XDG_RUNTIME_DIR": "/r"}, {"/r/reaperd/control.sock"}, "/run/reaperd/control.sock"),
])
def test_a_users_socket_follows_the_rule_of_the_cpp_library(uid, environ, present, expected):
    # The same rows as lib/src/user_defaults_test.cpp clients_find_the_users_daemon_after_reaperd_socket.
    assert reaperd.socket_path_from_environment(uid, environ, present.__contains__) == expected


@pytest.mark.parametrize("session, message", [
    ("", "session id is empty"),
    ("a b", 'session id "a b" has a space, control or non-ASCII character at byte 1'),
    ("caf\u00e9", "at byte 3"),
    ("x" * 257, "session id is 257 bytes long; the limit is 256"),
    (7, "session id must be a string"),
])
def test_bad_session_ids_are_refused_before_connecting(daemon, session, message):
    client = reaperd.Client(daemon.path)
    for call in (client.end, lambda s: client.orphan("c1", s), reaperd.Lease,
                 reaperd.labels_for):
        with pytest.raises(reaperd.ProtocolViolation) as error:
            call(session)
        assert message in str(error.value)
        assert isinstance(error.value, ValueError)
    with pytest.raises(reaperd.ProtocolViolation, match="container is empty"):
        client.orphan("")
    assert daemon.request_list() == []


def test_an_error_reply_raises_error_reply_with_the_daemons_message(sock_dir):
    def handler(request):
        return {"ok": False, "error": "end failed: disk full"}
    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        with pytest.raises(reaperd.ErrorReply, match="reaperd refused end: end failed: disk full"):
            reaperd.Client(daemon.path).end("s1")


def test_replies_say_what_happened(sock_dir):
    full_id = "a" * 64

    def handler(request):
        if request["op"] == "end":
            return {"ok": True, "session": request["session"], "known": True,
                    "already_ended": False, "dry_run": False,
                    "reaps_queued": {"containers": 2, "networks": 0, "volumes": 0}}
        if request["op"] == "orphan" and request["container"] == "theirs":
            return {"ok": False, "error": "container theirs (" + "b" * 64 + ") carries no session "
                    "label; reaperd does not own it; not reaped", "container": "b" * 64,
                    "name": "theirs", "owned": False, "queued": False}
        if request["op"] == "orphan":
            return {"ok": True, "container": full_id, "name": "web", "session": "s1",
                    "owned": True, "queued": True, "dry_run": False, "later": [1]}
        if request["op"] == "session":
            return {"ok": True, "session": request["session"], "known": True, "state": "ended",
                    "ready": True, "dry_run": False,
                    "remaining": {"containers": 0, "networks": 1, "volumes": 0}}
        return default_handler(request)

    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        client = reaperd.Client(daemon.path)
        ended = client.end("s1")
        assert ended["known"] is True and ended["reaps_queued"]["containers"] == 2
        orphan = client.orphan("web")
        assert orphan["container"] == full_id
        assert orphan["owned"] is True and orphan["queued"] is True
        with pytest.raises(reaperd.ErrorReply, match="reaperd does not own it") as refused:
            client.orphan("theirs")
        assert refused.value.reply["container"] == "b" * 64
        assert refused.value.reply["owned"] is False
        left = reaperd.Client(daemon.path).session("s1")
        assert left["remaining"] == {"containers": 0, "networks": 1, "volumes": 0}
        assert not control.nothing_remains(left)
        assert reaperd.orphan("web", socket_path=daemon.path)["container"] == full_id
        assert daemon.request_list()[-2] == {"op": "session", "session": "s1"}


def test_an_older_daemon_answers_end_and_orphan_with_ok_only(daemon):
    client = reaperd.Client(daemon.path)
    assert client.end("s1") == {"ok": True}
    assert client.orphan("c1") == {"ok": True}


def test_end_wait_returns_once_nothing_is_left(sock_dir):
    left = {"count": 3}

    def handler(request):
        if request["op"] == "session":
            left["count"] = max(0, left["count"] - 1)
            return {"ok": True, "session": request["session"], "known": True, "state": "ended",
                    "ready": True, "remaining": {"containers": left["count"], "networks": 0}}
        return default_handler(request)

    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        reply = reaperd.Client(daemon.path).end("s1", wait=True, timeout=10, poll_interval=0.01)
        assert reply == {"ok": True}
        assert daemon.ops() == ["end", "session", "session", "session"]
        # Not ready: a 0 proves nothing yet.
        assert not control.nothing_remains({"ok": True, "ready": False, "remaining": {"containers": 0}})
        assert not control.nothing_remains({"ok": True, "ready": True})


def test_end_wait_times_out_naming_what_is_left(sock_dir):
    def handler(request):
        if request["op"] == "session":
            return {"ok": True, "session": request["session"], "known": True, "state": "ended",
                    "ready": True, "remaining": {"containers": 1, "networks": 2, "volumes": 0}}
        return default_handler(request)

    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        began = time.monotonic()
        with pytest.raises(reaperd.WaitTimeout,
                           match="session s1: timed out after 0.3s: 1 container, 2 networks "
                                 "still there") as raised:
            reaperd.end("s1", socket_path=daemon.path, wait=True, wait_timeout=0.3)
        assert 0.3 <= time.monotonic() - began < 3
        assert raised.value.session == "s1"
        assert raised.value.reply["remaining"]["networks"] == 2
        assert isinstance(raised.value, reaperd.ControlError)


def test_end_wait_against_an_older_daemon_says_it_cannot_wait(sock_dir):
    def handler(request):
        if request["op"] == "session":
            return {"ok": False, "error": 'unknown op "session"; expected lease, end, orphan, '
                    "status or metrics"}
        return default_handler(request)

    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        with pytest.raises(reaperd.ErrorReply, match="too old to say what is left of a session"):
            reaperd.Client(daemon.path).end("s1", wait=True, timeout=5)


@pytest.mark.parametrize("answer, error, message", [
    (b"not json\n", reaperd.ControlError, "garbled reply: reply is not valid JSON"),
    (b'{"ok":"yes"}\n', reaperd.ControlError, 'garbled reply: reply has no boolean "ok" field'),
    (b'[1]\n', reaperd.ControlError, "garbled reply: reply is not a JSON object"),
    (b'{"ok":true}\n', reaperd.ControlError, 'a status reply needs a "status" object'),
    (b'{"ok":tr', reaperd.DaemonUnreachable, "closed the connection in the middle of a reply"),
    (CLOSE, reaperd.DaemonUnreachable, "the daemon closed the connection without a reply"),
])
def test_broken_replies(sock_dir, answer, error, message):
    with FakeDaemon(os.path.join(sock_dir, "s"), lambda request: answer) as daemon:
        with pytest.raises(error, match=message) as raised:
            reaperd.Client(daemon.path).status()
        if error is reaperd.ControlError:
            assert not isinstance(raised.value, reaperd.DaemonUnreachable)


def test_no_daemon_is_daemon_unreachable(sock_dir):
    with pytest.raises(reaperd.DaemonUnreachable, match="cannot reach reaperd at .*/none"):
        reaperd.Client(os.path.join(sock_dir, "none")).status()


def test_a_silent_daemon_times_out(sock_dir):
    with FakeDaemon(os.path.join(sock_dir, "s"), lambda request: SILENT) as daemon:
        began = time.monotonic()
        with pytest.raises(reaperd.DaemonUnreachable, match="timed out waiting for the reply"):
            reaperd.Client(daemon.path, timeout=0.3).status()
        assert 0.3 <= time.monotonic() - began < 3


def test_a_lease_is_held_while_the_block_runs_and_released_after(daemon):
    with reaperd.lease("build-1", daemon.path) as lease:
        assert lease.holds()
        assert daemon.wait_for(lambda: daemon.open_leases() == 1, 2)
        assert daemon.request_list() == [{"op": "lease", "session": "build-1"}]
    assert not lease.holds()
    assert daemon.wait_for(lambda: daemon.open_leases() == 0, 2)


def test_a_lease_comes_back_after_the_daemon_restarts(daemon):
    events = []
    lease = reaperd.Lease("build-1", daemon.path,
                          on_event=lambda l, event, error: events.append(event))
    with lease:
        daemon.stop()  # the daemon stops: the lease's connection closes, the socket goes
        assert daemon.wait_for(lambda: not lease.holds(), 2)
        time.sleep(0.5)
        daemon.start()
        assert daemon.wait_for(lease.holds, 5)
        assert daemon.wait_for(lambda: daemon.open_leases() == 1, 2)
    assert events[:2] == ["lost", "failing"]
    assert events[-1] == "taken"


def test_reconnect_backoff_starts_at_first_retry_doubles_and_is_capped(sock_dir):
    refusals = threading.Semaphore(6)  # the first lease plus five retries are refused

    def handler(request):
        if request.get("op") == "lease" and refusals.acquire(blocking=False):
            return {"ok": False, "error": "lease failed: try later"}
        return default_handler(request)

    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        lease = reaperd.Lease("build-1", daemon.path, first_retry=0.1, max_retry=0.5)
        assert isinstance(lease.start(), reaperd.ErrorReply)
        try:
            assert daemon.wait_for(lease.holds, 10)
        finally:
            lease.stop()
        times = daemon.lease_times()
        gaps = [b - a for a, b in zip(times, times[1:])]
        expected = [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
        assert len(gaps) == len(expected), gaps
        for gap, nominal in zip(gaps, expected):
            # Never early; late only by what a loaded machine adds.
            assert nominal * 0.95 <= gap < nominal + 0.5, (gaps, expected)


def test_after_a_lost_lease_the_first_retry_is_first_retry_later(daemon):
    with reaperd.lease("build-1", daemon.path, first_retry=0.15) as lease:
        lost_at = time.monotonic()
        daemon.drop_leases()
        assert daemon.wait_for(lambda: len(daemon.lease_times()) == 2, 5)
        # The fake daemon records the request before it answers, and the lease holds once the
        # answer is read: asked at once, it was not yet held (once beside two CPU-bound loops).
        assert daemon.wait_for(lease.holds, 5)
        assert 0.14 <= daemon.lease_times()[1] - lost_at < 1.0


def test_an_unreachable_daemon_does_not_stop_the_block_unless_required(sock_dir, caplog):
    path = os.path.join(sock_dir, "later.sock")
    with caplog.at_level(logging.WARNING, logger="reaperd"):
        with reaperd.lease("build-1", path) as lease:
            assert not lease.holds()
            with FakeDaemon(path) as daemon:  # the daemon appears: the lease is taken
                assert daemon.wait_for(lease.holds, 5)
    assert "no lease on build-1 yet" in caplog.text
    with pytest.raises(reaperd.DaemonUnreachable):
        with reaperd.lease("build-1", path, required=True):
            pytest.fail("the block ran without the required lease")


def test_a_refused_lease_raises_and_stops_trying(sock_dir):
    def handler(request):
        return {"ok": False, "error": "no"}
    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        with pytest.raises(reaperd.ErrorReply, match="reaperd refused lease: no"):
            with reaperd.lease("build-1", daemon.path):
                pytest.fail("the block ran without the lease")
        time.sleep(0.3)
        assert daemon.ops() == ["lease"]


def test_stop_returns_at_once_while_the_thread_waits_for_a_reply(sock_dir):
    answers = iter([{"ok": True}])

    def handler(request):
        return next(answers, SILENT)  # the first lease is taken, every later one hangs

    with FakeDaemon(os.path.join(sock_dir, "s"), handler) as daemon:
        lease = reaperd.Lease("build-1", daemon.path, timeout=30, first_retry=0.01)
        assert lease.start() is None
        daemon.drop_leases()
        assert daemon.wait_for(lambda: len(daemon.lease_times()) == 2, 5)
        time.sleep(0.05)  # the thread now waits for the reply
        began = time.monotonic()
        lease.stop()
        assert time.monotonic() - began < 0.5
        assert not lease._thread.is_alive()


def test_leases_leak_no_descriptors_or_threads(daemon):
    before_fds, before_threads = fd_count(), threading.active_count()
    for i in range(30):
        with reaperd.lease(f"s-{i}", daemon.path) as lease:
            assert lease.holds()
            assert not os.get_inheritable(lease._sock.fileno())  # never leaks into children
    # The fake daemon (in this process too) closes its ends of the connections as it sees
    # them closed.
    assert daemon.wait_for(lambda: fd_count() == before_fds, 5), (fd_count(), before_fds)
    assert daemon.wait_for(lambda: threading.active_count() == before_threads, 5)


def test_stop_is_idempotent_and_a_lease_starts_once(daemon):
    lease = reaperd.Lease("build-1", daemon.path)
    lease.start()
    with pytest.raises(RuntimeError):
        lease.start()
    lease.stop()
    lease.stop()
    assert not lease.holds()
    assert control.LOST == "lost"
