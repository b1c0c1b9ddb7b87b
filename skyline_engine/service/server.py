"""The transports: stdio (the editor starts the service) and TCP (a service on a remote machine).

Both run the same loop per client (`serve_client`): bytes → frames → `Dispatcher.handle`. Each
client has its own thread, so one slow or silent client never holds up another; messages to a
client are written under a per-connection lock, from its reader thread (responses) and its
analysis's thread (notifications).

TCP connections are admitted in two budgets (`Admission`): those that have authenticated (sent
`initialize` with the token) and those that have not yet. Anyone who reaches the port can open
connections, so the second budget is small and can never lock the user out: a new connection
always gets in, making room by closing the oldest unauthenticated one (with a message saying why).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

from skyline_engine.service.dispatcher import Dispatcher
from skyline_engine.service.engine import EngineService
from skyline_engine.service.protocol import (
    HANDSHAKE_TIMEOUT,
    PENDING_MAX_FRAME_BYTES,
    TOO_MANY_CONNECTIONS,
    FatalFrameError,
    FrameReader,
    RpcError,
    encode,
    notification,
)

log = logging.getLogger("skyline.service")

READ_SIZE = 1 << 16
# TCP connections that have authenticated: each is the user (it has the token).
MAX_CLIENTS = 16
# TCP connections that have not authenticated yet, apart from those: in all, and from one address.
MAX_PENDING = 8
MAX_PENDING_PER_PEER = 4


class Connection:
    """Thread-safe writing of whole messages; a write that fails marks the connection closed."""

    def __init__(self, write: Callable[[bytes], None], abort: Callable[[], None] = lambda: None) -> None:
        self._write = write
        self._abort = abort  # wakes the reader of a connection that can no longer be written
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def send(self, message: list[Any]) -> None:
        data = encode(message)
        with self._lock:
            if self.closed.is_set():
                return
            try:
                self._write(data)
            except (OSError, ValueError) as exc:  # gone, or too slow to read (socket timeout)
                log.info("closing a connection that cannot be written to: %s", exc)
                self.closed.set()
                self._abort()


def serve_client(
    read: Callable[[], bytes], connection: Connection, dispatcher: Dispatcher, max_frame_bytes: int
) -> None:
    """Read and dispatch until end of input, a broken stream, or the dispatcher says close."""
    frames = FrameReader(max_frame_bytes)
    while not connection.closed.is_set():
        # The smaller limit until `initialize` succeeds (it only grows, so no frame in progress is refused for it).
        frames.max_frame_bytes = (
            max_frame_bytes if dispatcher.initialized else min(max_frame_bytes, PENDING_MAX_FRAME_BYTES)
        )
        data = read()
        if not data:
            return
        try:
            for obj in frames.feed(data):
                if not dispatcher.handle(obj) or connection.closed.is_set():
                    return
        except FatalFrameError as exc:
            connection.send(notification("protocol_error", exc.error.to_wire()))
            return


# --- stdio ----------------------------------------------------------------------------------


def run_stdio(engine: EngineService) -> int:
    """Serve the editor on stdin/stdout until stdin closes or `shutdown`."""
    # The protocol gets a private copy of stdout, and fd 1 becomes stderr: a stray print (ours,
    # a library's) then lands in the log instead of corrupting the message stream.
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    connection = Connection(lambda data: _write_all(protocol_fd, data))
    dispatcher = Dispatcher(engine, connection.send, token=None)

    def read_stdin() -> None:
        try:
            serve_client(lambda: _read(0), connection, dispatcher, engine.config.max_frame_bytes)
        finally:
            dispatcher.close()  # stdin closed: the editor has quit, taking its analysis with it
            engine.request_shutdown()

    engine.start()
    threading.Thread(target=read_stdin, name="stdio", daemon=True).start()
    try:
        _wait(engine)
    finally:
        engine.close()
    return 0


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_SIZE)
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _wait(engine: EngineService) -> None:
    # Short waits so that signals (Ctrl-C, SIGTERM) are handled promptly in the main thread.
    while not engine.stopping.wait(0.5):
        pass


# --- TCP ------------------------------------------------------------------------------------


class Seat:
    """One TCP connection, as admission sees it."""

    def __init__(self, sock: socket.socket, host: str) -> None:
        self.sock = sock
        self.host = host
        self.evicted: str | None = None  # why it was closed to make room, once it is


class Admission:
    """Who may hold a TCP connection: at most `max_clients` authenticated, and apart from them at
    most `max_pending` that have not authenticated yet (`max_pending_per_peer` from one address).

    A new connection is always admitted as pending. When that budget is full, the oldest pending
    connection makes room (from the same address when that address is at its own limit): idle
    sockets then delay no one, however many are opened, since the newest connection always has its
    chance to authenticate, and a real client sends `initialize` at once. Authenticated
    connections are never closed to make room.
    """

    def __init__(
        self,
        max_clients: int = MAX_CLIENTS,
        max_pending: int = MAX_PENDING,
        max_pending_per_peer: int = MAX_PENDING_PER_PEER,
    ) -> None:
        self.max_clients = max_clients
        self.max_pending = max_pending
        self.max_pending_per_peer = max_pending_per_peer
        self._lock = threading.Lock()
        self._pending: list[Seat] = []  # oldest first
        self._clients: set[Seat] = set()

    def arrive(self, seat: Seat) -> Seat | None:
        """Admit `seat` as pending; returns the seat closed to make room, if any."""
        with self._lock:
            same_peer = [s for s in self._pending if s.host == seat.host]
            evicted = None
            if len(same_peer) >= self.max_pending_per_peer:
                evicted = same_peer[0]
                evicted.evicted = (
                    f"closed to make room: {self.max_pending_per_peer} connections from {seat.host} had not "
                    "sent `initialize` yet; send it as soon as you connect"
                )
            elif len(self._pending) >= self.max_pending:
                evicted = self._pending[0]
                evicted.evicted = (
                    f"closed to make room: {self.max_pending} connections had not sent `initialize` yet; "
                    "send it as soon as you connect"
                )
            if evicted is not None:
                self._pending.remove(evicted)
            self._pending.append(seat)
            return evicted

    def authenticate(self, seat: Seat) -> None:
        """Count `seat` among the authenticated; RpcError (closing) when it cannot be."""
        with self._lock:
            if seat.evicted is not None:
                raise RpcError(TOO_MANY_CONNECTIONS, seat.evicted, close=True)
            if len(self._clients) >= self.max_clients:
                raise RpcError(
                    TOO_MANY_CONNECTIONS, f"{self.max_clients} clients are connected already; try later", close=True
                )
            self._pending.remove(seat)
            self._clients.add(seat)

    def leave(self, seat: Seat) -> None:
        with self._lock:
            if seat in self._pending:
                self._pending.remove(seat)
            self._clients.discard(seat)

    def sockets(self) -> list[socket.socket]:
        with self._lock:
            return [seat.sock for seat in (*self._pending, *self._clients)]


class TcpServer:
    def __init__(self, engine: EngineService, host: str, port: int, token: str) -> None:
        self.engine = engine
        self.token = token
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family)
        self.address = self.listener.getsockname()[:2]
        self.admission = Admission()

    def run(self) -> int:
        self.engine.start()
        threading.Thread(target=self._accept, name="accept", daemon=True).start()
        try:
            _wait(self.engine)
        finally:
            self.close()
        return 0

    def close(self) -> None:
        self.engine.request_shutdown()
        with contextlib.suppress(OSError):
            self.listener.close()
        # Ends every client's analysis, each with its final notification, while the clients are
        # still connected to receive it; then they are disconnected.
        self.engine.close()
        for sock in self.admission.sockets():
            _shutdown(sock)

    def _accept(self) -> None:
        self.listener.settimeout(0.5)
        while not self.engine.stopping.is_set():
            try:
                sock, peer = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            seat = Seat(sock, str(peer[0]))
            evicted = self.admission.arrive(seat)
            if evicted is not None:
                log.info("%s", evicted.evicted)
                # Wakes its thread, which tells its client why and closes; writing stays possible.
                with contextlib.suppress(OSError):
                    evicted.sock.shutdown(socket.SHUT_RD)
            threading.Thread(target=self._serve, args=(seat, peer), name=f"client-{peer}", daemon=True).start()

    def _serve(self, seat: Seat, peer: tuple[str, int] | tuple[str, int, int, int]) -> None:
        log.info("client %s connected", peer)
        config = self.engine.config
        sock = seat.sock
        sock.settimeout(config.send_timeout_s)  # bounds sendall to a client that stopped reading
        connection = Connection(sock.sendall, abort=lambda: _shutdown(sock))
        dispatcher = Dispatcher(
            self.engine, connection.send, token=self.token, admit=lambda: self.admission.authenticate(seat)
        )
        deadline = time.monotonic() + config.handshake_timeout_s

        def close_with(code: str, message: str) -> bytes:
            connection.send(notification("protocol_error", {"code": code, "message": message}))
            return b""

        def read() -> bytes:
            # Before `initialize` succeeds, a client that sends nothing is dropped at the deadline;
            # one closed to make room for another (Admission) is told why.
            while not connection.closed.is_set():
                if seat.evicted is not None:
                    return close_with(TOO_MANY_CONNECTIONS, seat.evicted)
                if not dispatcher.initialized:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        limit = config.handshake_timeout_s
                        return close_with(HANDSHAKE_TIMEOUT, f"no successful `initialize` within {limit:g} s")
                    sock.settimeout(min(remaining, config.send_timeout_s))
                else:
                    sock.settimeout(config.send_timeout_s)
                try:
                    data = sock.recv(READ_SIZE)
                except socket.timeout:
                    continue  # idle after the handshake is fine
                except OSError:
                    data = b""
                if data or seat.evicted is None:
                    return data
            return b""

        try:
            serve_client(read, connection, dispatcher, config.max_frame_bytes)
        except Exception:
            log.exception("client %s", peer)
        finally:
            dispatcher.close()  # a client gone mid-analysis takes its worker with it
            connection.closed.set()
            self.admission.leave(seat)
            _shutdown(sock)
            sock.close()
            log.info("client %s disconnected", peer)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def print_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
