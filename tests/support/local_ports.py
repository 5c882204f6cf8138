"""Free localhost ports for the servers the tests start, reserved until a server takes them.

Binding port 0 and closing the socket (what each test did on its own) hands back a port that nothing
holds: until the server the test starts binds it, seconds later, another test running beside it
(`pytest -n`) or an outgoing connection may be given the same port. `free_port()` leaves the port in
TIME_WAIT instead (a connection to it, closed from the listening side first): for the next 60 s the
kernel hands it to no `bind(("", 0))` and to no outgoing connection, while a server that binds it
with SO_REUSEADDR (asyncio's servers, uvicorn, grpc, prometheus_client, Prometheus, werkzeug: every
server these tests start) takes it at once. A server that binds without SO_REUSEADDR cannot use it
within those 60 s: give it `free_port(is_reused=False)`.
"""

from __future__ import annotations

import socket

LOCALHOST = "127.0.0.1"


def free_port(host: str = LOCALHOST, is_reused: bool = True) -> int:
    """A port on `host` that no socket holds, reserved by the kernel (TIME_WAIT) for a server that
    binds it with SO_REUSEADDR; `is_reused=False`: released at once, for one that does not."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        port: int = listener.getsockname()[1]
        if not is_reused:
            return port
        listener.listen(1)
        with socket.create_connection((host, port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the listening side closes first: its end (host:port) waits in TIME_WAIT
            client.recv(1)  # the FIN has arrived: the client's close completes the handshake
    return port


def free_ports(count: int, host: str = LOCALHOST) -> list[int]:
    """`count` distinct ports, each as `free_port` gives it."""
    return [free_port(host) for _ in range(count)]
