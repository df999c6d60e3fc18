"""The session label helpers, with a stand-in for docker-py's client."""

import pytest

import reaperd


def test_labels_for_adds_the_session_label_to_a_copy():
    assert reaperd.labels_for("s1") == {"reaperd.session": "s1"}
    mine = {"app": "web"}
    assert reaperd.labels_for("s1", mine) == {"app": "web", "reaperd.session": "s1"}
    assert mine == {"app": "web"}
    # docker-py also takes a list of keys (empty values).
    assert reaperd.labels_for("s1", ["a", "b"]) == {"a": "", "b": "", "reaperd.session": "s1"}
    assert reaperd.labels_for("s1", {"reaperd.session": "s1"}) == {"reaperd.session": "s1"}


def test_labels_for_refuses_a_label_naming_another_session():
    with pytest.raises(ValueError, match="already name session 'other'"):
        reaperd.labels_for("s1", {"reaperd.session": "other"})


class FakeContainers:
    def __init__(self):
        self.calls = []

    def create(self, image, command=None, **kwargs):
        self.calls.append(("create", image, command, kwargs))
        return "created"

    def run(self, image, command=None, stdout=True, stderr=False, remove=False, **kwargs):
        self.calls.append(("run", image, command, dict(kwargs, stdout=stdout, stderr=stderr,
                                                       remove=remove)))
        return "ran"

    def list(self, **kwargs):
        return ["listed", kwargs]


class FakeDockerClient:
    def __init__(self):
        self.containers = FakeContainers()
        self.api = "the low-level client"

    def ping(self):
        return True


def test_label_client_labels_what_create_and_run_make_and_passes_the_rest_through():
    docker = FakeDockerClient()
    client = reaperd.label_client(docker, "s1")
    labels = {"app": "web"}
    assert client.containers.create("busybox", ["sleep", "1"], name="a", labels=labels) == "created"
    assert client.containers.run("busybox", "true", True, True, detach=True) == "ran"
    assert docker.containers.calls == [
        ("create", "busybox", ["sleep", "1"],
         {"name": "a", "labels": {"app": "web", "reaperd.session": "s1"}}),
        ("run", "busybox", "true",
         {"detach": True, "labels": {"reaperd.session": "s1"}, "stdout": True, "stderr": True,
          "remove": False}),
    ]
    assert labels == {"app": "web"}
    # Everything else is the wrapped client's.
    assert client.containers.list(all=True) == ["listed", {"all": True}]
    assert client.ping() is True
    assert client.api == "the low-level client"
    assert client.unwrapped is docker
    assert client.session == "s1"


def test_label_client_refuses_another_session_in_the_callers_labels():
    client = reaperd.label_client(FakeDockerClient(), "s1")
    with pytest.raises(ValueError):
        client.containers.run("busybox", labels={"reaperd.session": "s2"})


def test_label_client_wraps_a_real_docker_py_client():
    docker = pytest.importorskip("docker")
    real = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    client = reaperd.label_client(real, "s1")
    assert client.containers.model is docker.models.containers.Container
    assert client.api is real.api
