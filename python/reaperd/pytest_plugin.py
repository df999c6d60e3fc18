"""A pytest plugin: one reaperd session per test run, and labelled containers.

Enabled by the `pytest11` entry point of the installed package (python3-reaperd), or with
`pytest_plugins = ["reaperd.pytest_plugin"]` in a conftest.py, or `-p reaperd.pytest_plugin`.
It does nothing until a test asks for one of its fixtures; then it takes a lease on the
run's session and keeps it (reconnecting when reaperd restarts) until the run ends, so the
containers the run leaves behind are reaped `lease_grace` after pytest exits, however it
exits.

Fixtures:
  reaperd_session  the session id (str): --reaperd-session, else $REAPERD_SESSION, else a new
                   "pytest-<pid>-<random>" id, exported as $REAPERD_SESSION while the run lasts
  reaperd_lease    the reaperd.Lease held on it
  reaperd_labels   {"reaperd.session": <id>}, a new dict for each test
  reaperd_docker   docker.from_env() wrapped by reaperd.label_client(): containers.create()
                   and containers.run() label what they make (skipped without docker-py)

When reaperd cannot be reached the run goes on with a warning (the lease is retried in the
background) unless --reaperd-required is given; a daemon that refuses the lease fails the
fixture.
"""

import os
import secrets
import warnings

import pytest

from .control import DaemonUnreachable, Lease
from .labels import label_client, labels_for


class ReaperdWarning(UserWarning):
    """reaperd could not be reached: the run's containers have no safety net yet."""


def pytest_addoption(parser):
    group = parser.getgroup("reaperd", "reaperd sessions for the containers tests create")
    group.addoption("--reaperd-session", default=None, metavar="ID",
                    help="session id to lease and label with (default: $REAPERD_SESSION or a "
                         "new one)")
    group.addoption("--reaperd-socket", default=None, metavar="PATH",
                    help="reaperd's control socket (default: $REAPERD_SOCKET, else the user's "
                         "$XDG_RUNTIME_DIR/reaperd/control.sock if it exists, else "
                         "/run/reaperd/control.sock)")
    group.addoption("--reaperd-required", action="store_true", default=False,
                    help="fail the fixtures when reaperd cannot be reached")


def _session_id(config):
    return (config.getoption("reaperd_session") or os.environ.get("REAPERD_SESSION")
            or f"pytest-{os.getpid()}-{secrets.token_hex(4)}")


@pytest.fixture(scope="session")
def reaperd_lease(pytestconfig):
    session = _session_id(pytestconfig)
    lease = Lease(session, pytestconfig.getoption("reaperd_socket"),
                  required=pytestconfig.getoption("reaperd_required"))
    error = lease.start()
    if isinstance(error, DaemonUnreachable) and not lease.required:
        warnings.warn(ReaperdWarning(
            f"no reaperd lease on {session} yet ({error}); retrying in the background"))
    elif error is not None:
        lease.stop()
        raise error
    previous = os.environ.get("REAPERD_SESSION")
    os.environ["REAPERD_SESSION"] = session
    try:
        yield lease
    finally:
        if previous is None:
            os.environ.pop("REAPERD_SESSION", None)
        else:
            os.environ["REAPERD_SESSION"] = previous
        lease.stop()


@pytest.fixture(scope="session")
def reaperd_session(reaperd_lease):
    return reaperd_lease.session


@pytest.fixture
def reaperd_labels(reaperd_session):
    return labels_for(reaperd_session)


@pytest.fixture(scope="session")
def reaperd_docker(reaperd_session):
    docker = pytest.importorskip("docker")
    client = docker.from_env()
    try:
        yield label_client(client, reaperd_session)
    finally:
        client.close()
