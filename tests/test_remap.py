from __future__ import annotations

import json

import pytest

from syncd.restore.remap import Remapper, Rule


def test_prefix_is_boundary_aware() -> None:
    r = Remapper([Rule("/Users/bob", "/home/bob")])
    line = (b'{"cwd":"/Users/bob/app","a":"/Users/bobby/x","b":"/x/Users/bob/y",'
            b'"c":"cd /Users/bob && ls","d":"/Users/bob"}')
    assert r.line(line) == (b'{"cwd":"/home/bob/app","a":"/Users/bobby/x","b":"/x/Users/bob/y",'
                            b'"c":"cd /home/bob && ls","d":"/home/bob"}')


def test_longest_rule_wins() -> None:
    r = Remapper([Rule("/home/a", "/home/b"), Rule("/home/a/code/app", "/srv/app")])
    assert r.path("/home/a/code/app/src") == "/srv/app/src"
    assert r.path("/home/a/code/other") == "/home/b/code/other"
    assert r.line(b'"/home/a/code/app/x /home/a/y"') == b'"/srv/app/x /home/b/y"'


def test_thinking_and_signatures_are_never_touched() -> None:
    r = Remapper([Rule("/home/a", "/home/b")])
    entry = {"type": "assistant", "cwd": "/home/a/p", "message": {"content": [
        {"type": "thinking", "thinking": "look at /home/a/p/x.py", "signature": "/home/a=="},
        {"type": "redacted_thinking", "data": "/home/a/enc"},
        {"type": "tool_use", "input": {"file_path": "/home/a/p/x.py"}}]}}
    raw = json.dumps(entry, separators=(",", ":")).encode()
    out = json.loads(r.line(raw))
    blocks = out["message"]["content"]
    assert blocks[0] == entry["message"]["content"][0]  # type: ignore[index]
    assert blocks[1]["data"] == "/home/a/enc"
    assert blocks[2]["input"]["file_path"] == "/home/b/p/x.py"
    assert out["cwd"] == "/home/b/p"


def test_everything_else_is_byte_identical() -> None:
    r = Remapper([Rule("/home/a", "/home/b")])
    raw = b'{"z":1,  "cwd":"/home/a","uuid":"u-1","parentUuid":null,"\xc3\xa9":"\\u00e9"}'
    assert r.line(raw) == raw.replace(b"/home/a", b"/home/b")


def test_windows_paths_in_json_form() -> None:
    r = Remapper([Rule("C:\\Users\\bob\\proj", "/home/b/proj")])
    raw = b'{"cwd":"C:\\\\Users\\\\bob\\\\proj\\\\src\\\\a b.py","x":"C:\\\\Users\\\\bobby"}'
    assert json.loads(r.line(raw)) == {"cwd": "/home/b/proj/src/a b.py",
                                       "x": "C:\\Users\\bobby"}
    assert r.path("C:\\Users\\bob\\proj\\src") == "/home/b/proj/src"


def test_project_folder_names_are_rewritten_in_paths() -> None:
    r = Remapper([Rule("/home/a", "/home/b")], {"-home-a-app": "-home-b-app"})
    raw = b'"<persisted-output>/home/a/.claude/projects/-home-a-app/s/tool-results/t.txt"'
    assert r.line(raw) == raw.replace(b"/home/a/", b"/home/b/").replace(b"-home-a-", b"-home-b-")
    assert r.folder("-home-a-app") == "-home-b-app" and r.folder("other") == "other"


def test_identity_changes_nothing() -> None:
    r = Remapper([Rule("/home/a", "/home/a")])
    assert r.identity and r.line(b'{"cwd":"/home/a"}') == b'{"cwd":"/home/a"}'


@pytest.mark.parametrize("path", ["/home/a", "/home/a/", "/home/a/x"])
def test_path(path: str) -> None:
    assert Remapper([Rule("/home/a/", "/w/")]).path(path).startswith("/w")


def test_path_after_a_json_escape_is_rewritten() -> None:
    r = Remapper([Rule("/home/a/work/app", "/w/app")])
    assert r.line(b'{"x":"out:\\n/home/a/work/app\\n1","y":"1\\t/home/a/work/app/f"}') == (
        b'{"x":"out:\\n/w/app\\n1","y":"1\\t/w/app/f"}')
    assert r.line(b'{"x":"C:\\\\new/home/a/work/app"}') == b'{"x":"C:\\\\new/home/a/work/app"}'
