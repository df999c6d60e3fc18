"""A Python client for reaperd (standard library only).

    import reaperd

    with reaperd.lease("build-4711"):          # held, and taken again if reaperd restarts
        client = reaperd.label_client(docker.from_env(), "build-4711")
        client.containers.run("busybox", "sleep 600", detach=True)   # labelled reaperd.session
        ...
    reaperd.end("build-4711", wait=True)       # optional: reap its containers now, and wait
                                               # until they are gone (WaitTimeout after 300 s)
    reaperd.orphan(container_id)               # reap one container now (a delete failed)
    reaperd.status()                           # the daemon's status, a dict

The socket is $REAPERD_SOCKET, else the user's own reaperd's (socket_path_from_environment), unless socket_path= is given.
The protocol: docs/control-protocol.md. The pytest plugin: reaperd.pytest_plugin.
"""

from .control import (
    DEFAULT_SOCKET_PATH,
    Client,
    ControlError,
    DaemonUnreachable,
    ErrorReply,
    Lease,
    ProtocolViolation,
    WaitTimeout,
    socket_path_from_environment,
    validate_container,
    validate_session_id,
)
from .labels import SESSION_LABEL, LabelledClient, label_client, labels_for

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "SESSION_LABEL",
    "Client",
    "ControlError",
    "DaemonUnreachable",
    "ErrorReply",
    "LabelledClient",
    "Lease",
    "ProtocolViolation",
    "WaitTimeout",
    "end",
    "label_client",
    "labels_for",
    "lease",
    "metrics",
    "orphan",
    "session",
    "socket_path_from_environment",
    "status",
    "validate_container",
    "validate_session_id",
]


def lease(session, socket_path=None, **options):
    """A context manager holding a lease on `session` (see Lease for the options)."""
    return Lease(session, socket_path, **options)


def end(session, socket_path=None, timeout=2.0, wait=False, wait_timeout=300.0):
    """Ends the session: reaperd reaps its containers now. Returns the reply (a dict: see
    Client.end). With wait=True, returns once nothing of the session is left, or raises
    WaitTimeout after wait_timeout seconds. `timeout` is each exchange's."""
    return Client(socket_path, timeout).end(session, wait=wait, timeout=wait_timeout)


def orphan(container, session=None, socket_path=None, timeout=2.0):
    """Asks reaperd to reap one container now (only if it owns it by label). Returns the
    reply (a dict: the full id it was pinned to, owned, queued; see Client.orphan)."""
    return Client(socket_path, timeout).orphan(container, session)


def session(session, socket_path=None, timeout=2.0):
    """What reaperd still sees of the session (a dict; see Client.session)."""
    return Client(socket_path, timeout).session(session)


def status(socket_path=None, timeout=2.0, ended=False, limit=None):
    """The daemon's status object, a dict (Client.status says what ended and limit do)."""
    return Client(socket_path, timeout).status(ended=ended, limit=limit)


def metrics(socket_path=None, timeout=2.0):
    """The daemon's metrics, Prometheus text."""
    return Client(socket_path, timeout).metrics()
