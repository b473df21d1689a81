"""Where ``redact`` may mask a value: in JSON strings of transcript lines (never signed
ones), and anywhere in plain text, such as a tool output the CLI keeps in
``<sid>/tool-results/<id>.txt`` (tests/test_e2e_purge.py records one with the real CLI)."""

from __future__ import annotations

import json
import re

from syncd.mask import apply, mask_of, value_places

SECRET = b"ghp_" + b"aB3dE5gH7jK9mN1pQ2sT4vW6yZ8cF0hJ2kL4"
PATTERN = re.compile(rb"ghp_[A-Za-z0-9]{36}")


def masked(data: bytes) -> tuple[bytes, list[str | None]]:
    ranges, found = value_places([data], [], [PATTERN])
    return apply(data, 0, ranges), [f.why for f in found]


def test_plain_text_is_masked_wherever_the_value_is() -> None:
    out = b"GITHUB_TOKEN=" + SECRET + b"\n" + SECRET + b"\n1\n2\n"
    got, why = masked(out)
    assert got == out.replace(SECRET, mask_of(len(SECRET))) and len(got) == len(out)
    assert why == [None, None]


def test_json_lines_keep_their_rules() -> None:
    said = json.dumps({"type": "user", "message": {"content": f"my {SECRET.decode()}"}})
    thought = json.dumps({"type": "assistant", "message": {"content": [
        {"type": "thinking", "thinking": f"it is {SECRET.decode()}", "signature": "c2ln"}]}})
    cut = b'{"type":"assistant","message":{"content":[{"type":"thinking","thinking":"' + SECRET
    data = f"{said}\n{thought}\n".encode() + cut
    got, why = masked(data)
    assert why == [None, "inside a thinking string (signed)", "not inside a string"]
    lines = got.splitlines()
    assert json.loads(lines[0])["message"]["content"] == "my " + mask_of(len(SECRET)).decode()
    assert lines[1] == thought.encode() and lines[2] == cut  # left alone, reported


def test_a_key_in_plain_json_text_is_not_a_plain_line() -> None:
    line = b'{"' + SECRET + b'": 1}\n'
    ranges, found = value_places([line], [], [PATTERN])
    assert ranges == [] and [f.why for f in found] == ["inside a key"]


def test_bytes_that_are_not_text_are_left_alone() -> None:
    png = b"\x89PNG\r\n\x1a\n\xff\xfe" + SECRET + b"\x00\x01"
    got, why = masked(png)
    assert got == png and why == ["not inside a string"]
