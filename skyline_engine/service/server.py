"""The transports: stdio (the editor starts the service) and TCP (a service on a remote machine).

Both run the same loop per client (`serve_client`): bytes → frames → `Dispatcher.handle`. Each
client has its own thread, so one slow or silent client never holds up another; messages to a
client are written under a per-connection lock, from its reader thread (responses) and its
analysis's thread (notifications).
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
    FatalFrameError,
    FrameReader,
    encode,
    notification,
)

log = logging.getLogger("skyline.service")

READ_SIZE = 1 << 16
MAX_CLIENTS = 16


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


class TcpServer:
    def __init__(self, engine: EngineService, host: str, port: int, token: str) -> None:
        self.engine = engine
        self.token = token
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family)
        self.address = self.listener.getsockname()[:2]
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()

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
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
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
            with self._lock:
                full = len(self._clients) >= MAX_CLIENTS
                if not full:
                    self._clients.add(sock)
            if full:
                log.info("refusing %s: %d clients already", peer, MAX_CLIENTS)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, peer), name=f"client-{peer}", daemon=True).start()

    def _serve(self, sock: socket.socket, peer: tuple[str, int] | tuple[str, int, int, int]) -> None:
        log.info("client %s connected", peer)
        config = self.engine.config
        sock.settimeout(config.send_timeout_s)  # bounds sendall to a client that stopped reading
        connection = Connection(sock.sendall, abort=lambda: _shutdown(sock))
        dispatcher = Dispatcher(self.engine, connection.send, token=self.token)
        deadline = time.monotonic() + config.handshake_timeout_s

        def read() -> bytes:
            # Before `initialize` succeeds, a client that sends nothing is dropped at the deadline.
            while not connection.closed.is_set():
                if not dispatcher.initialized:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        connection.send(
                            notification(
                                "protocol_error",
                                {
                                    "code": HANDSHAKE_TIMEOUT,
                                    "message": f"no successful `initialize` within {config.handshake_timeout_s:g} s",
                                },
                            )
                        )
                        return b""
                    sock.settimeout(min(remaining, config.send_timeout_s))
                else:
                    sock.settimeout(config.send_timeout_s)
                try:
                    return sock.recv(READ_SIZE)
                except socket.timeout:
                    continue  # idle after the handshake is fine
                except OSError:
                    return b""
            return b""

        try:
            serve_client(read, connection, dispatcher, config.max_frame_bytes)
        except Exception:
            log.exception("client %s", peer)
        finally:
            dispatcher.close()  # a client gone mid-analysis takes its worker with it
            connection.closed.set()
            with self._lock:
                self._clients.discard(sock)
            _shutdown(sock)
            sock.close()
            log.info("client %s disconnected", peer)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def print_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
