"""A TLS-terminating proxy for the Redis TLS tests (test_redis_tls*.py): the redis-server the
tests start is built without TLS, so the proxy holds the server certificate, optionally demands a
client certificate (mTLS), and forwards the plaintext to the server's own port."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
from pathlib import Path

from redis_tls_pki import LOOPBACK, Leaf

from cache_runtime.keys import ExactKey


class TlsProxy:
    """Accepts TLS on a free loopback port and forwards the plaintext to `upstream_port`.

    One thread accepts; each connection gets one thread that does the server-side handshake and
    then shuttles bytes with `select`. One thread per connection, not one per direction:
    OpenSSL does not promise that one SSL object may read and write from two threads at once.
    `client_ca` set: a client certificate signed by it is required (mTLS). Handshake failures
    are recorded in `rejected`, so a test can say why a client was turned away.
    """

    def __init__(self, upstream_port: int, server: Leaf, client_ca: Path | None = None) -> None:
        self.upstream_port = upstream_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(server.cert_file, server.key_file)
        if client_ca is not None:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(client_ca)
        self._listener = socket.create_server((LOOPBACK, 0))
        self._listener.settimeout(0.1)  # how often the acceptor looks at `_stopping`
        self.port: int = self._listener.getsockname()[1]
        self.rejected: list[ssl.SSLError | OSError] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="tls-proxy-accept")

    def start(self) -> TlsProxy:
        self._acceptor.start()
        return self

    def present(self, server: Leaf) -> None:
        """Hand `server` to every handshake from now on (a certificate rotation); connections
        already up keep the one they were made with."""
        self._context.load_cert_chain(server.cert_file, server.key_file)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed by stop()
                return
            worker = threading.Thread(target=self._serve, args=(conn,), name="tls-proxy-conn")
            with self._lock:
                self._sockets.add(conn)
                self._threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        tls: ssl.SSLSocket | None = None
        try:
            conn.settimeout(5)  # bounds the handshake
            try:
                tls = self._context.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as err:
                self.rejected.append(err)
                return
            upstream = socket.create_connection((LOOPBACK, self.upstream_port), timeout=5)
            with self._lock:
                self._sockets.update((tls, upstream))
            self._pump(tls, upstream)
        except OSError:
            pass  # a peer went away or stop() shut the sockets: the connection is over
        finally:
            for sock in (tls, upstream, conn):
                if sock is not None:
                    with self._lock:
                        self._sockets.discard(sock)
                    sock.close()

    def _pump(self, tls: ssl.SSLSocket, upstream: socket.socket) -> None:
        peer = {tls: upstream, upstream: tls}
        while not self._stopping.is_set():
            # Bytes OpenSSL already decrypted are invisible to select: drain them first.
            ready = [tls] if tls.pending() else select.select([tls, upstream], [], [], 0.2)[0]
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                peer[sock].sendall(data)

    def stop(self) -> None:
        """Close the listener and every connection, then join all threads."""
        self._stopping.set()
        self._acceptor.join(timeout=10)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):  # already closed by its peer
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
            threads = [self._acceptor, *self._threads]
        for thread in threads:
            thread.join(timeout=10)
            assert not thread.is_alive(), f"{thread.name} did not stop"

    def __enter__(self) -> TlsProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def key(prompt: str) -> str:
    """The key of acme's answer to `prompt`: what the TLS tests write through their tiers."""
    return ExactKey.of("acme", "tiny-gpt2", prompt).to_string()
