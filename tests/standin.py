"""A loopback stand-in for the Anthropic Messages API, for end-to-end tests with the real CLI.

By default it answers every POST /v1/messages with a short streamed text reply and keeps
each request body so a test can inspect exactly what the CLI sent. A ``respond``
callable can script the answer instead: it gets the request body and returns the
assistant's content blocks (``text``, ``thinking`` with a ``signature``, ``tool_use``),
which are streamed the way the real API streams them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Block = dict[str, Any]
Responder = Callable[[dict[str, Any]], list[Block]]


def _block_events(index: int, block: Block) -> list[tuple[str, dict[str, Any]]]:
    """The content_block_start/delta/stop events that stream one content block."""
    kind = block["type"]
    if kind == "text":
        start: Block = {"type": "text", "text": ""}
        deltas: list[Block] = [{"type": "text_delta", "text": block["text"]}]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
    else:
        raise ValueError(f"stand-in cannot stream a {kind!r} block")
    return [("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": start}),
            *(("content_block_delta", {"type": "content_block_delta", "index": index,
                                       "delta": d}) for d in deltas),
            ("content_block_stop", {"type": "content_block_stop", "index": index})]


class StandIn:
    def __init__(self, reply: str = "ok", respond: Responder | None = None) -> None:
        self.reply = reply
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                n = int(self.headers.get("content-length") or 0)
                return self.rfile.read(n) if n else b""

            def do_GET(self) -> None:
                with outer._lock:
                    outer.paths.append("GET " + self.path)
                self._json(404, {"type": "error", "error": {"type": "not_found_error",
                                                           "message": "stand-in"}})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                raw = self._body()
                with outer._lock:
                    outer.paths.append("POST " + self.path)
                if not self.path.startswith("/v1/messages"):
                    self._json(404, {"type": "error", "error": {"type": "not_found_error",
                                                               "message": "stand-in"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                if self.path.startswith("/v1/messages/count_tokens"):
                    self._json(200, {"input_tokens": 10})
                    return
                with outer._lock:
                    outer.requests.append(body)
                if body.get("stream"):
                    self._stream(body)
                else:
                    self._json(200, outer._message(body))

            def _json(self, code: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any]) -> None:
                msg = outer._message(body)
                start = {**msg, "content": [], "stop_reason": None}
                events: list[tuple[str, dict[str, Any]]] = [
                    ("message_start", {"type": "message_start", "message": start})]
                for i, block in enumerate(msg["content"]):
                    events.extend(_block_events(i, block))
                events += [
                    ("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": msg["stop_reason"],
                                                 "stop_sequence": None},
                                       "usage": {"output_tokens": 1}}),
                    ("message_stop", {"type": "message_stop"}),
                ]
                payload = b"".join(
                    f"event: {name}\ndata: {json.dumps(doc)}\n\n".encode()
                    for name, doc in events)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        content = (self.respond(body) if self.respond is not None
                   else [{"type": "text", "text": self.reply}])
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        return {"id": f"msg_standin_{len(self.requests)}", "type": "message",
                "role": "assistant", "model": body.get("model", "claude-standin"),
                "content": content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
