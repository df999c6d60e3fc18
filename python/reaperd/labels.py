"""The session label, for containers made with docker-py (or anything that takes labels).

reaperd owns a container if and only if it carries the label `reaperd.session=<session id>`;
these helpers put it there at creation, the only time labels can be set. They do not import
docker: label_client() wraps whatever client object it is given.
"""

from .control import validate_session_id

__all__ = ["SESSION_LABEL", "labels_for", "label_client", "LabelledClient"]

SESSION_LABEL = "reaperd.session"


def labels_for(session, labels=None):
    """A new labels dict: `labels` (a dict, or a list of keys as docker-py allows) plus
    reaperd.session=<session>. Raises ValueError if `labels` names another session."""
    validate_session_id(session)
    if labels is None:
        merged = {}
    elif isinstance(labels, dict):
        merged = dict(labels)
    else:
        merged = {str(key): "" for key in labels}
    current = merged.get(SESSION_LABEL)
    if current not in (None, session):
        raise ValueError(f"labels already name session {current!r} in {SESSION_LABEL}, "
                         f"not {session!r}")
    merged[SESSION_LABEL] = session
    return merged


class _LabelledContainers:
    """client.containers, with create() and run() adding the session label."""

    def __init__(self, containers, session):
        self._containers = containers
        self._session = session

    def create(self, image, command=None, *args, **kwargs):
        kwargs["labels"] = labels_for(self._session, kwargs.get("labels"))
        return self._containers.create(image, command, *args, **kwargs)

    def run(self, image, command=None, *args, **kwargs):
        kwargs["labels"] = labels_for(self._session, kwargs.get("labels"))
        return self._containers.run(image, command, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._containers, name)


class LabelledClient:
    """A docker-py DockerClient whose containers.create() and containers.run() label every
    container with the session; everything else is the wrapped client's. The low-level
    `client.api.create_container()` is not wrapped: pass it `labels=labels_for(session)`."""

    def __init__(self, client, session):
        validate_session_id(session)
        self.unwrapped = client
        self.session = session
        self.containers = _LabelledContainers(client.containers, session)

    def __getattr__(self, name):
        return getattr(self.unwrapped, name)

    def __repr__(self):
        return f"reaperd.LabelledClient({self.unwrapped!r}, session={self.session!r})"


def label_client(client, session):
    """Wraps a docker-py client (docker.from_env(), docker.DockerClient(...)) so that the
    containers it creates carry reaperd.session=<session>."""
    return LabelledClient(client, session)
