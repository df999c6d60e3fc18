"""The pytest plugin, run in an inner pytest (pytester) against a fake control server."""

import os
import tempfile

import pytest

from fake_daemon import FakeDaemon

pytest_plugins = ["pytester"]


@pytest.fixture
def daemon():
    with tempfile.TemporaryDirectory(prefix="reaperd-pytest.") as d:
        with FakeDaemon(os.path.join(d, "control.sock")) as server:
            yield server


INNER_TESTS = """
import os
import reaperd

def test_one(reaperd_session, reaperd_lease, reaperd_labels):
    assert reaperd_lease.holds()
    assert os.environ["REAPERD_SESSION"] == reaperd_session
    assert reaperd_labels == {"reaperd.session": reaperd_session}
    open("session.txt", "w").write(reaperd_session)

def test_two(reaperd_session):
    assert open("session.txt").read() == reaperd_session  # one session for the whole run
"""


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "reaperd.pytest_plugin", "-p", "no:cacheprovider",
                                         *args)


def test_one_lease_for_the_whole_run_released_when_it_ends(pytester, daemon, monkeypatch):
    monkeypatch.setenv("REAPERD_SOCKET", daemon.path)
    monkeypatch.delenv("REAPERD_SESSION", raising=False)
    pytester.makepyfile(INNER_TESTS)
    result = run(pytester)
    result.assert_outcomes(passed=2)
    session = (pytester.path / "session.txt").read_text()
    assert session.startswith("pytest-")
    assert daemon.request_list() == [{"op": "lease", "session": session}]
    assert daemon.wait_for(lambda: daemon.open_leases() == 0, 5)
    assert [e[1:] for e in daemon.lease_events] == [("open", session), ("closed", session)]


def test_the_session_comes_from_reaperd_session_or_the_option(pytester, daemon, monkeypatch):
    monkeypatch.setenv("REAPERD_SOCKET", daemon.path)
    monkeypatch.setenv("REAPERD_SESSION", "ci-run-42")
    pytester.makepyfile(INNER_TESTS)
    run(pytester).assert_outcomes(passed=2)
    run(pytester, "--reaperd-session", "other-7").assert_outcomes(passed=2)
    assert daemon.request_list() == [{"op": "lease", "session": "ci-run-42"},
                                     {"op": "lease", "session": "other-7"}]


def test_a_run_that_uses_no_fixture_takes_no_lease(pytester, daemon, monkeypatch):
    monkeypatch.setenv("REAPERD_SOCKET", daemon.path)
    pytester.makepyfile("def test_plain():\n    pass\n")
    run(pytester).assert_outcomes(passed=1)
    assert daemon.request_list() == []


def test_without_reaperd_the_run_goes_on_with_a_warning_unless_required(pytester, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("REAPERD_SOCKET", str(tmp_path / "none.sock"))
    pytester.makepyfile("def test_uses(reaperd_session):\n    assert reaperd_session\n")
    result = run(pytester)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*ReaperdWarning: no reaperd lease on pytest-*"])
    result = run(pytester, "--reaperd-required")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*DaemonUnreachable: cannot reach reaperd at*"])
