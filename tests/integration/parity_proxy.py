"""A tiny real HTTP/1.1 forwarding proxy on loopback, for the parity sidecar's integration tests.

It sits in front of a real engine server and can (a) delay the first ``slow_first`` requests
it sees for each distinct /generate body by ``delay_s`` seconds -- a slow server, as the
sidecar's timeout sees it --, answer ``unavailable_status`` (503; 429 or 502 is what a load
balancer sends), with a ``Retry-After: retry_after`` header when set, to the first
``unavailable_first`` ones, (b) call
``on_generate(n)`` before forwarding the n-th /generate request (a test kills the real upstream
there: the server dies with work outstanding), (c) be pointed at a different upstream while
running (a restarted server), (d) answer a request itself with the HTTP status that
``respond(path, body)`` returns (None forwards it): a broken server, or one failing one prompt,
and (e) pass the upstream's JSON answer to a /generate through ``rewrite(answer)`` (which changes
it in place) before sending it on, as JSON that may hold NaN and -Infinity: a server that
answers the baseline's tokens with its logprobs or finish reason falsified. When the upstream
cannot be reached it closes the client's connection without an answer, which is what a dead
server looks like to a client.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx


class ForwardingProxy:
    def __init__(
        self,
        upstream: str,
        delay_s: float = 0.0,
        slow_first: int = 0,
        unavailable_first: int = 0,
        on_generate: Callable[[int], None] | None = None,
        respond: Callable[[str, bytes], int | None] | None = None,
        rewrite: Callable[[dict], None] | None = None,
        unavailable_status: int = 503,
        retry_after: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.on_generate = on_generate
        self.respond = respond
        self.unavailable_first = unavailable_first
        self.unavailable_status = unavailable_status
        self.retry_after = retry_after
        self.rewrite = rewrite
        self.arrived_at: list[float] = []  # monotonic arrival time of every /generate
        self.generate_spans: list[tuple[float, float]] = []  # (arrived, answered) of each answered
        self.delay_s = delay_s
        self.slow_first = slow_first
        self.generate_bodies: Counter[bytes] = Counter()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        started.set()
        self._loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def attempts(self) -> int:
        return sum(self.generate_bodies.values())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    return
                method, path, _ = request_line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = self.respond(path, body) if self.respond is not None else None
                if status is not None:
                    answer = b'{"error": {"message": "answered by the test proxy"}}'
                    writer.write(
                        f"HTTP/1.1 {status} Test\r\ncontent-type: application/json\r\n"
                        f"content-length: {len(answer)}\r\n\r\n".encode()
                        + answer
                    )
                    await writer.drain()
                    continue
                arrived = time.monotonic()
                if path == "/generate":
                    self.generate_bodies[body] += 1
                    self.arrived_at.append(arrived)
                    if self.on_generate is not None:
                        self.on_generate(self.attempts)
                    if self.generate_bodies[body] <= self.slow_first:
                        await asyncio.sleep(self.delay_s)
                    if self.generate_bodies[body] <= self.unavailable_first:
                        extra = f"retry-after: {self.retry_after}\r\n" if self.retry_after else ""
                        writer.write(
                            f"HTTP/1.1 {self.unavailable_status} Unavailable\r\n{extra}"
                            "content-length: 0\r\n\r\n".encode()
                        )
                        await writer.drain()
                        continue
                try:
                    async with httpx.AsyncClient(timeout=120) as client:
                        resp = await client.request(
                            method,
                            self.upstream + path,
                            content=body,
                            headers={"content-type": headers.get("content-type", "")},
                        )
                except httpx.TransportError:
                    return  # upstream gone: drop the connection without an answer
                content = resp.content
                if path == "/generate" and self.rewrite is not None and resp.status_code == 200:
                    answer = resp.json()
                    self.rewrite(answer)
                    content = json.dumps(answer).encode()  # NaN, -Infinity as Python writes them
                head = (
                    f"HTTP/1.1 {resp.status_code} {resp.reason_phrase}\r\n"
                    f"content-type: {resp.headers.get('content-type', 'text/plain')}\r\n"
                    f"content-length: {len(content)}\r\n\r\n"
                )
                if path == "/generate":  # stamped before the answer leaves: the client's next
                    # request can only follow it, whenever this thread runs again
                    self.generate_spans.append((arrived, time.monotonic()))
                writer.write(head.encode() + content)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # close(): the test is over, held requests are simply dropped
        finally:
            writer.close()
