"""awm_grpo.http_pool against real sockets: small asyncio servers on 127.0.0.1 that answer as scripted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from awm_grpo.http_pool import HttpError, HttpPool, Origin

Reply = Callable[[int, bytes], bytes | None]  # (request number, request head) -> raw reply; None: hang up


class Scripted:
    """Counts connections and requests; answers request n with `reply(n, head)`."""

    def __init__(self, reply: Reply, close_after_reply: bool = False) -> None:
        self.reply, self.close_after_reply = reply, close_after_reply
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length")]
                body = await reader.readexactly(length[0]) if length else b""
                self.requests.append(head + body)
                raw = self.reply(len(self.requests), head)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                if self.close_after_reply or raw.startswith(b"HTTP/1.0"):  # 1.0: the body ends with the connection
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(script: Scripted) -> AsyncIterator[Origin]:
    listener = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    try:
        yield Origin.parse(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
    finally:
        listener.close()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def test_origin_parsing() -> None:
    assert Origin.parse("http://127.0.0.1:8001/") == Origin("http", "127.0.0.1", 8001, "")
    assert Origin.parse("https://example.org/base/").host_header == "example.org"
    assert Origin.parse("http://[::1]:9/x").host_header == "[::1]:9"
    with pytest.raises(ValueError, match="not an http"):
        Origin.parse("ftp://example.org")


def test_keep_alive_reuses_one_connection_and_frames_by_length() -> None:
    script = Scripted(lambda n, head: ok(b"reply %d" % n))

    async def story() -> list[bytes]:
        pool = HttpPool()
        async with serving(script) as origin:
            bodies = [(await pool.request(origin, "POST", "/x", {"a": "b"}, b"{}", 5)).body for _ in range(3)]
        pool.close()
        return bodies

    assert asyncio.run(story()) == [b"reply 1", b"reply 2", b"reply 3"]
    assert script.connections == 1
    assert script.requests[0].startswith(b"POST /x HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"\r\na: b\r\ncontent-length: 2\r\n\r\n{}" in script.requests[0]


def test_chunked_bodies_interim_replies_and_bodies_that_end_with_the_connection() -> None:
    chunked = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n")
    until_close = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it"
    script = Scripted(lambda n, head: until_close if n == 2 else chunked)

    async def story() -> list[tuple[int, bytes]]:
        pool = HttpPool()
        async with serving(script) as origin:
            first, second, third = [await pool.request(origin, "GET", "/", {}, b"", 5) for _ in range(3)]
        pool.close()
        return [(r.status, r.body) for r in (first, second, third)]

    assert asyncio.run(story()) == [(200, b"hello, world"), (200, b"all of it"), (200, b"hello, world")]
    assert script.connections == 2  # the chunked reply kept its connection; the until-close one did not


def test_a_reused_connection_the_server_closed_is_retried_once_a_fresh_one_never() -> None:
    script = Scripted(lambda n, head: ok(b"ok"), close_after_reply=True)  # closes idle connections at once

    async def story() -> list[bytes]:
        pool = HttpPool()
        async with serving(script) as origin:
            first = await pool.request(origin, "POST", "/", {}, b"1", 5)
            await asyncio.sleep(0.05)  # the server's close reaches us while the connection idles in the pool
            second = await pool.request(origin, "POST", "/", {}, b"2", 5)
        pool.close()
        return [first.body, second.body]

    assert asyncio.run(story()) == [b"ok", b"ok"]
    assert [r[-1:] for r in script.requests] == [b"1", b"2"]  # each request reached the server exactly once

    hang_up = Scripted(lambda n, head: None)

    async def fresh() -> None:
        pool = HttpPool()
        async with serving(hang_up) as origin:
            await pool.request(origin, "POST", "/", {}, b"x", 5)

    with pytest.raises(HttpError, match="closed the connection without replying"):
        asyncio.run(fresh())
    assert len(hang_up.requests) == 1


def test_deadlines_refusals_and_garbage_are_http_errors() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            writer.close()

    async def story() -> list[str]:
        pool = HttpPool()
        messages = []
        listener = await asyncio.start_server(silent, "127.0.0.1", 0)
        origin = Origin.parse(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
        for make in (lambda: pool.request(origin, "GET", "/", {}, b"", 0.2),):
            with pytest.raises(HttpError) as caught:
                await make()
            messages.append(str(caught.value))
        listener.close()
        await listener.wait_closed()
        with pytest.raises(HttpError) as caught:
            await pool.request(origin, "GET", "/", {}, b"", 2)
        messages.append(str(caught.value))
        async with serving(Scripted(lambda n, head: b"SSH-2.0-OpenSSH\r\n\r\n")) as other:
            with pytest.raises(HttpError) as caught:
                await pool.request(other, "GET", "/", {}, b"", 2)
            messages.append(str(caught.value))
        pool.close()
        return messages

    timeout, refused, garbage = asyncio.run(story())
    assert "no reply within 0.2 s" in timeout
    assert "cannot connect" in refused
    assert "not an HTTP reply" in garbage


def test_a_stream_left_early_does_not_go_back_to_the_pool() -> None:
    script = Scripted(lambda n, head: ok(b"x" * 100))

    async def story() -> bytes:
        pool = HttpPool()
        async with serving(script) as origin:
            async with pool.stream(origin, "GET", "/", {}, b"") as reply:
                assert reply.status == 200  # body left unread
            body = (await pool.request(origin, "GET", "/", {}, b"", 5)).body
        pool.close()
        return body

    assert asyncio.run(story()) == b"x" * 100
    assert script.connections == 2


def self_signed_127(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_https_origins_verify_the_server(tmp_path: Path) -> None:
    cert, key = self_signed_127(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    script = Scripted(lambda n, head: ok(b"over tls"))

    async def story() -> tuple[bytes, str]:
        listener = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=server_tls)
        origin = Origin.parse(f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}")
        trusting = HttpPool(tls=ssl.create_default_context(cafile=str(cert)))
        bodies = [(await trusting.request(origin, "GET", "/", {}, b"", 5)).body for _ in range(2)]
        trusting.close()
        default = HttpPool()  # the system trust store does not know this certificate
        with pytest.raises(HttpError) as refused:
            await default.request(origin, "GET", "/", {}, b"", 5)
        default.close()
        listener.close()
        return b" ".join(bodies), str(refused.value)

    bodies, refused = asyncio.run(story())
    assert bodies == b"over tls over tls" and script.connections == 1
    assert "CERTIFICATE_VERIFY_FAILED" in refused
