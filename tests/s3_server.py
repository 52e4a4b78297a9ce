"""A real object store for the tests and benchmarks: moto's S3-compatible server on a free localhost
port, and a proxy in front of it that delays every request (``pip install "moto[server]"``).

lidarshard reaches the server through the environment, as it would reach any S3-compatible store:
``AWS_ENDPOINT_URL`` (read by pyarrow's S3 filesystem, the trainer side, and by boto3, which Beam's
S3 filesystem uses in pipelines), ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` and
``AWS_REGION``. ``S3Server.environment()`` sets them (restoring the old values after) and clears
lidarshard's per-process cache of pyarrow filesystems on the way in and out, so no filesystem built
for one endpoint serves another.

From a benchmark script (run from the repository root, so that ``tests`` imports)::

    from tests.s3_server import LatencyProxy, S3Server

    with S3Server() as s3, LatencyProxy(s3.port, delay_s=0.05) as slow:
        with s3.environment():  # s3://BUCKET/... straight to the server
            ...
        with s3.environment(slow.endpoint):  # the same bucket, every request 50 ms later
            ...

In tests: the session fixture ``s3_server`` (skips with one line when moto is not installed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs
import pytest

__all__ = ["BUCKET", "LatencyProxy", "S3Server", "s3_server", "upload"]

#: The bucket ``S3Server`` creates.
BUCKET = "lidarshard-test"

#: Seconds the server has to answer its first request.
START_TIMEOUT_S = 60.0

_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_REGION = "us-east-1"
#: Every variable ``environment()`` sets or clears: what it does not name (a profile, a session token,
#: a config file) could point the clients at another store.
_UNSET = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


#: urllib without the environment's HTTP proxies: the server is on this host.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto_server() -> str | None:
    """The ``moto_server`` script of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "moto_server"
    return str(beside) if beside.is_file() else shutil.which("moto_server")


def _clear_filesystem_cache() -> None:
    from lidarshard.transforms.io import storage

    storage._arrow_fs.cache_clear()


class S3Server:
    """``moto_server`` on a free port of 127.0.0.1 with ``BUCKET`` created; a context manager.

    Attributes:
        port: the server's port. endpoint: ``http://127.0.0.1:PORT``.
    """

    def __init__(self, bucket: str = BUCKET) -> None:
        self.bucket = bucket
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        # The server logs a line per request: a pipe nobody reads would fill and stall it.
        self._log = tempfile.TemporaryFile("a+b")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> S3Server:
        script = _moto_server()
        if script is None:
            raise FileNotFoundError('moto_server not found: pip install "moto[server]"')
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        try:
            for _ in range(3):  # the free port may be taken between asking and binding
                self.port = _free_port()
                self._process = subprocess.Popen(
                    [script, "-H", "127.0.0.1", "-p", str(self.port)],
                    stdin=subprocess.DEVNULL,
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
                if self._wait():
                    break
                self._stop()
            else:
                raise RuntimeError(f"moto_server did not start: {self.log()[-500:]}")
            self.filesystem(self.endpoint, create_bucket=True).create_dir(self.bucket)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait(self) -> bool:
        """Poll the server until it answers (True) or its process ends or the time is up (False)."""
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with _DIRECT.open(self.endpoint + "/", timeout=1.0) as r:
                    r.read()
                return True
            except urllib.error.HTTPError:
                return True  # any HTTP answer: it serves
            except OSError:
                time.sleep(0.05)  # not listening yet
        return False

    def _stop(self) -> None:
        p, self._process = self._process, None
        if p is None:
            return
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def __exit__(self, *exc: object) -> None:
        self._stop()
        self._log.close()

    def log(self) -> str:
        """What the server has written so far (a line per request)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def filesystem(self, endpoint: str | None = None, create_bucket: bool = False) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem on ``endpoint`` (default: the server), independent of the environment."""
        host = (endpoint or self.endpoint).removeprefix("http://")
        return pafs.S3FileSystem(
            access_key=_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_key=_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            endpoint_override=host,
            scheme="http",
            region=_REGION,
            allow_bucket_creation=create_bucket,
        )

    def uri(self, *parts: str) -> str:
        """``s3://BUCKET/part/...``."""
        return "/".join([f"s3://{self.bucket}", *parts])

    @contextmanager
    def environment(self, endpoint: str | None = None) -> Iterator[dict[str, str]]:
        """The AWS variables pointing s3:// at ``endpoint`` (default: the server) for the block; the old
        values come back after it, and lidarshard's cached pyarrow filesystems are dropped both ways."""
        values = {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_REGION": _REGION,
            "AWS_DEFAULT_REGION": _REGION,
            "AWS_EC2_METADATA_DISABLED": "true",  # never probe an instance-metadata service
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "NO_PROXY": "127.0.0.1,localhost",  # boto3 honours HTTP(S)_PROXY
            "no_proxy": "127.0.0.1,localhost",
            **_CREDENTIALS,
        }
        with _environ(values, _UNSET):
            _clear_filesystem_cache()
            try:
                yield values
            finally:
                _clear_filesystem_cache()


@contextmanager
def _environ(values: Mapping[str, str], unset: tuple[str, ...]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*values, *unset)}
    os.environ.update(values)
    for k in unset:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upload(fs: pafs.FileSystem, local: Path, remote: str) -> int:
    """Copy the tree ``local`` to ``remote`` (``BUCKET/key-prefix``) in ``fs``; the number of files."""
    pafs.copy_files(str(local), remote, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return sum(1 for p in local.rglob("*") if p.is_file())


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 in front of ``127.0.0.1:upstream_port`` that holds each request
    ``delay_s`` seconds before passing it on; a context manager.

    A request is the first bytes a client sends on a connection, or after the server last answered on
    it (keep-alive connections are reused); the rest of its body passes at once, so a request pays
    ``delay_s`` once (a body sent after ``100 Continue`` pays it again). Connections are served in
    parallel, so concurrent requests overlap their delays as on a network with that latency.

    Attributes:
        port, endpoint (``http://127.0.0.1:PORT``), requests: the requests delayed so far.
    """

    def __init__(self, upstream_port: int, delay_s: float = 0.05) -> None:
        self.upstream_port, self.delay_s = upstream_port, delay_s
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LatencyProxy:
        self._start(self._accept, "accept")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, close every connection and wait for the proxy's threads."""
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._sockets]
        for s in sockets:
            _close(s)
        for t in self._threads:
            t.join(timeout=5)

    def _start(self, target, name: str, *args: object) -> None:
        t = threading.Thread(target=target, args=args, name=f"latency-proxy-{name}", daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._sockets.update(socks)
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                _close(client)
                continue
            if not self._track(client, server):
                _close(client)
                _close(server)
                return
            self._start(self._serve, "conn", client, server)

    def _serve(self, client: socket.socket, server: socket.socket) -> None:
        answered = threading.Event()
        answered.set()  # the first bytes of a connection are a request
        self._start(self._pump, "answers", server, client, answered, False)
        self._pump(client, server, answered, True)

    def _pump(
        self, src: socket.socket, dst: socket.socket, answered: threading.Event, requests: bool
    ) -> None:
        try:
            while data := src.recv(1 << 16):
                if requests and answered.is_set():
                    answered.clear()
                    with self._lock:
                        self.requests += 1
                    time.sleep(self.delay_s)
                elif not requests:
                    answered.set()
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # either side went away
        finally:
            if not requests:  # the server is done with this connection: so is the client
                for s in (src, dst):
                    _close(s)
                    with self._lock:
                        self._sockets.discard(s)


def _close(s: socket.socket) -> None:
    """Close ``s``, waking a thread blocked in its ``recv``/``accept`` (``close`` alone does not)."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already shut
    s.close()


@contextmanager
def shared_model_loader() -> Iterator[None]:
    """One botocore model loader per data path while inside: a new boto3 session re-reads botocore's
    JSON service models (about 0.3 s of CPU), and Beam's S3 filesystem makes a new session for every
    list, open, copy, exists and delete, which made the CPU of a 4-sample scan on the server. The models
    are read-only data; what a client sends and receives is unchanged."""
    import botocore.session

    make = botocore.session.create_loader
    loaders: dict[str | None, object] = {}

    def shared(search_path_string: str | None = None):
        if search_path_string not in loaders:
            loaders[search_path_string] = make(search_path_string)
        return loaders[search_path_string]

    botocore.session.create_loader = shared
    try:
        yield
    finally:
        botocore.session.create_loader = make


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server with ``BUCKET`` for the test session (skips when moto is not installed), its
    clients sharing botocore's model loader (``shared_model_loader``)."""
    if _moto_server() is None:
        pytest.skip('moto[server] is not installed (pip install "moto[server]")')
    with S3Server() as server, shared_model_loader():
        yield server
