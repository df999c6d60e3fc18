"""The Python client against a real reaperd (this build's, $REAPERD_PATH) and a private engine
(tests/harness/engine-guard, $REAPER_ENGINE_GUARD), through Debian's docker-py.

The seed incident end to end: a sandbox made with docker-py (labelled by label_client) whose
delete gets 409 (a running container removed without force), the error swallowed, the owner
process exits: reaperd removes the container lease_grace later, while a container whose
session still holds its lease is never touched.
"""

import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time

import docker
import pytest

import reaperd

IMAGE = "reaperd-pytest/busybox:latest"
LEASE_GRACE = 3  # seconds; a restarted reaperd gives leases this long to come back


def eventually(condition, limit=60.0, interval=0.05):
    """Polls until condition() holds or `limit` seconds pass (a loaded 2-core machine)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            if condition():
                return True
        except Exception:
            pass  # the daemon or the engine is restarting: not yet
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def busybox_tar():
    """A root file system with /bin/busybox and its applets, as tests/harness/engine.cpp makes."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name in ("bin", "tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add("/bin/busybox", "bin/busybox")
        for tool in ("sh", "sleep", "true", "echo", "test"):
            info = tarfile.TarInfo(f"bin/{tool}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return data.getvalue()


@pytest.fixture(scope="module")
def engine():
    """A private dockerd: engine-guard starts it and stops it when its stdin closes."""
    guard = subprocess.Popen([os.environ["REAPER_ENGINE_GUARD"]], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        answer = guard.stdout.readline().strip()
        assert answer.startswith("ready "), f"engine-guard: {answer!r}"
        address = "unix://" + answer.split(" ", 1)[1] + "/docker.sock"
        client = docker.DockerClient(base_url=address, version="auto")
        client.api.import_image_from_data(busybox_tar(), repository=IMAGE.split(":")[0],
                                          tag="latest")
        yield address
        client.close()
    finally:
        guard.stdin.close()  # EOF: the guard stops the engine and removes its dir
        guard.wait(timeout=120)


def die_with_parent():
    """In the child: SIGKILL when the test process dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Reaperd:
    """reaperd as a child process with a config like tests/integration/daemon_fixture.hpp's."""

    def __init__(self, engine_address, directory):
        self.dir = directory
        self.socket = os.path.join(directory, "control.sock")
        self.config = os.path.join(directory, "reaperd.yaml")
        self.log = os.path.join(directory, "reaperd.log")
        with open(self.config, "w") as out:
            out.write(textwrap.dedent(f"""\
                engine:
                  host: {engine_address}
                control:
                  socket: {self.socket}
                state:
                  dir: {directory}/state
                sessions:
                  lease_grace: {LEASE_GRACE}s
                reaper:
                  retry_initial: 200ms
                  retry_max: 2s
                  resync_interval: 30s
                """))
        self.process = None

    def start(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NOTIFY_SOCKET", "JOURNAL_STREAM", "WATCHDOG_",
                                    "DOCKER_API_VERSION"))}
        with open(self.log, "a") as log:
            self.process = subprocess.Popen([os.environ["REAPERD_PATH"], "--config", self.config],
                                            stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            preexec_fn=die_with_parent)
        ready = eventually(lambda: self.process.poll() is None and self.status()["ready"])
        assert ready, f"reaperd did not become ready; its log:\n{self.log_text()}"

    def terminate(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self.process = None
        return code

    def kill(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def status(self):
        # Every session, the ended ones too (a plain status lists only the newest few ended).
        return reaperd.status(self.socket, limit=1000000)

    def session_state(self, session):
        for s in self.status()["sessions"]:
            if s["id"] == session:
                return s["state"]
        return ""

    def log_text(self):
        with open(self.log) as f:
            return f.read()


@pytest.fixture(scope="module")
def daemon(engine):
    with tempfile.TemporaryDirectory(prefix="reaperd-pytest.") as directory:
        d = Reaperd(engine, directory)
        d.start()
        try:
            yield d
        finally:
            d.kill()


@pytest.fixture(scope="module")
def docker_client(engine):
    client = docker.DockerClient(base_url=engine, version="auto")
    yield client
    client.close()


def exists(client, container_id):
    try:
        client.containers.get(container_id)
        return True
    except docker.errors.NotFound:
        return False


def unique(prefix):
    unique.counter = getattr(unique, "counter", 0) + 1
    return f"{prefix}-{os.getpid()}-{unique.counter}"


# The owner of the seed incident: holds a lease on its session, makes a sandbox with docker-py
# through label_client, fails to delete it (409: it is running and no force was asked for),
# swallows the error as the field report's code did, and exits.
# Prints the leaked sandbox's id, the status its delete got, and the time (CLOCK_MONOTONIC,
# the same in every process) just before its lease closes: no reap may come lease_grace
# earlier than that. The parent's own clock after the owner's exit is later by the
# interpreter's shutdown, over 1 s on a loaded machine (a CI run).
OWNER = """
import sys, time, docker, reaperd
session, engine, socket_path, image = sys.argv[1:5]
with reaperd.lease(session, socket_path, required=True):
    client = reaperd.label_client(docker.DockerClient(base_url=engine, version="auto"), session)
    sandbox = client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none")
    try:
        sandbox.remove()
    except docker.errors.APIError as e:
        print(sandbox.id, e.status_code, end=" ")  # swallowed
    print(time.monotonic(), flush=True)
"""


def test_seed_incident_the_leaked_sandbox_is_reaped_and_the_live_one_is_not(
        engine, daemon, docker_client):
    live = unique("py-live")
    dead = unique("py-dead")
    with reaperd.lease(live, daemon.socket, required=True):
        live_client = reaperd.label_client(docker_client, live)
        live_container = live_client.containers.run(IMAGE, ["sleep", "600"], detach=True,
                                                    network_mode="none")
        assert live_container.labels["reaperd.session"] == live

        owner = subprocess.run([sys.executable, "-c", OWNER, dead, engine, daemon.socket, IMAGE],
                               capture_output=True, text=True, timeout=120)
        assert owner.returncode == 0, owner.stderr
        leaked_id, status, lease_closing_at = owner.stdout.split()
        assert status == "409"
        leaked = docker_client.containers.get(leaked_id)
        assert leaked.labels["reaperd.session"] == dead
        assert leaked.status == "running"

        assert eventually(lambda: not exists(docker_client, leaked_id)), daemon.log_text()
        assert time.monotonic() - float(lease_closing_at) >= LEASE_GRACE  # not before lease_grace
        assert daemon.session_state(dead) == "ended"

        # The live session's container is untouched, also well past another lease_grace.
        time.sleep(LEASE_GRACE + 1)
        live_container.reload()
        assert live_container.status == "running"
        assert daemon.session_state(live) == "leased"

    # Ending the session reaps its container now; with wait=True, end returns once it is gone.
    reply = reaperd.end(live, daemon.socket, wait=True, wait_timeout=60)
    assert reply["known"] is True and reply["reaps_queued"]["containers"] == 1
    assert not exists(docker_client, live_container.id), daemon.log_text()


def test_an_orphan_report_reaps_one_labelled_container_now(daemon, docker_client):
    session = unique("py-orphan")
    with reaperd.lease(session, daemon.socket, required=True):
        client = reaperd.label_client(docker_client, session)
        orphan = client.containers.run(IMAGE, ["sleep", "600"], detach=True, network_mode="none")
        kept = client.containers.run(IMAGE, ["sleep", "600"], detach=True, network_mode="none")
        unlabelled = docker_client.containers.run(IMAGE, ["sleep", "600"], detach=True,
                                                  network_mode="none")
        reply = reaperd.orphan(orphan.id[:12], session, socket_path=daemon.socket)
        assert reply["container"] == orphan.id  # the prefix, pinned to the full id
        assert reply["owned"] is True and reply["queued"] is True
        with pytest.raises(reaperd.ErrorReply, match="carries no session label") as refused:
            reaperd.orphan(unlabelled.id, socket_path=daemon.socket)
        assert refused.value.reply["container"] == unlabelled.id
        assert refused.value.reply["owned"] is False
        assert eventually(lambda: not exists(docker_client, orphan.id)), daemon.log_text()
        time.sleep(1)
        assert exists(docker_client, kept.id)
        assert exists(docker_client, unlabelled.id)  # never without the session label
    reaperd.end(session, daemon.socket)
    assert eventually(lambda: not exists(docker_client, kept.id))
    assert exists(docker_client, unlabelled.id)
    unlabelled.remove(force=True)


def test_a_lease_outlives_a_reaperd_restart(daemon, docker_client):
    session = unique("py-restart")
    events = []
    with reaperd.lease(session, daemon.socket, required=True,
                       on_event=lambda lease, event, error: events.append(event)) as lease:
        container = reaperd.label_client(docker_client, session).containers.run(
            IMAGE, ["sleep", "600"], detach=True, network_mode="none")
        assert eventually(lambda: daemon.session_state(session) == "leased")
        assert daemon.terminate() == 0
        assert eventually(lambda: not lease.holds(), 10)
        daemon.start()
        assert eventually(lease.holds, 10), events
        assert events[0] == "lost" and events[-1] == "taken", events
        # Past the fresh lease_grace the restarted daemon gave the session: still alive.
        time.sleep(LEASE_GRACE + 1)
        assert daemon.session_state(session) == "leased"
        assert exists(docker_client, container.id)
    assert eventually(lambda: not exists(docker_client, container.id)), daemon.log_text()


PLUGIN_TESTS = """
import json, os, reaperd

def test_makes_a_sandbox(reaperd_docker, reaperd_session):
    sandbox = reaperd_docker.containers.run({image!r}, ["sleep", "600"], detach=True,
                                            network_mode="none")
    assert sandbox.labels["reaperd.session"] == reaperd_session
    states = {{s["id"]: s["state"] for s in reaperd.status()["sessions"]}}
    with open({out!r}, "w") as out:
        json.dump({{"id": sandbox.id, "session": reaperd_session,
                   "state": states.get(reaperd_session)}}, out)
    # ...and leaves it behind.
"""


def test_the_pytest_plugin_leases_the_run_and_labels_its_containers(engine, daemon,
                                                                    docker_client, tmp_path):
    out = tmp_path / "made.json"
    test_file = tmp_path / "sandbox_test.py"
    test_file.write_text(PLUGIN_TESTS.format(image=IMAGE, out=str(out)))
    env = dict(os.environ, REAPERD_SOCKET=daemon.socket, DOCKER_HOST=engine)
    env.pop("REAPERD_SESSION", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "reaperd.pytest_plugin",
                          "-p", "no:cacheprovider", str(test_file)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    made = json.loads(out.read_text())
    assert made["session"].startswith("pytest-")
    assert made["state"] == "leased"
    # The run is over and its lease gone: its leftover is reaped after lease_grace.
    assert eventually(lambda: not exists(docker_client, made["id"])), daemon.log_text()
    assert daemon.session_state(made["session"]) == "ended"


def test_status_and_metrics(daemon):
    status = reaperd.Client(daemon.socket).status()
    assert status["ready"] is True
    assert isinstance(status["sessions"], list)
    assert "reaperd_" in reaperd.metrics(daemon.socket)
