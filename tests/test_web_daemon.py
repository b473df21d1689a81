"""``web = true``: the daemon serves the page, says where, and counts what the store is
asked for (the dashboard's cost)."""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from syncd.backup.state import State
from syncd.config import load_settings
from syncd.service.billing import META, PRICE, counted, monthly, record
from syncd.store import MemoryStore, RetryStore
from syncd.store.requests import REQUESTS
from syncd.web.server import URL_FILE
from tests.browser import env_of
from tests.helpers import running, wait_for, write


def test_the_store_wrapper_counts_requests_as_s3_bills_them() -> None:
    REQUESTS.take()
    s = RetryStore(MemoryStore())
    for i in range(1500):
        s.put(f"k/{i:05d}", b"x")
    s.get("k/00000")
    s.head("k/00001")
    assert len(list(s.list("k/"))) == 1500
    list(s.list("nothing/"))
    s.delete_many([f"k/{i:05d}" for i in range(1001)])
    got = REQUESTS.take()
    assert got == {"PUT": 1500, "GET": 1, "HEAD": 1, "LIST": 2 + 1, "DELETE": 2}
    assert REQUESTS.take() == dict.fromkeys(got, 0)


def test_counts_add_up_in_the_state_and_price_a_month(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite")
    try:
        REQUESTS.take()
        REQUESTS.add("PUT", 1000)
        first = record(state, now=1000.0)
        REQUESTS.add("PUT", 1000)
        REQUESTS.add("GET", 10000)
        doc = record(state, now=1000.0 + 86400)
        assert first["since"] == doc["since"] == 1000.0
        assert counted(state)["PUT"] == 2000 and counted(state)["GET"] == 10000
        state.set_meta(**{META: "not json"})
        assert counted(state)["PUT"] == 0  # damaged: started over, not an error
    finally:
        state.close()
    # A day's 2,000 PUTs and 10,000 GETs: 30 days of them.
    m = monthly(doc, stored_bytes=10**9, now=1000.0 + 86400)
    want = 30 * (2 * PRICE["PUT"] + 10 * PRICE["GET"])
    assert abs(m["requests"] - want) < 1e-9
    assert abs(m["storage"] - 0.023) < 1e-12
    assert abs(m["total"] - want - 0.023) < 1e-9


def test_the_daemon_serves_the_page_and_says_where(tmp_path: Path) -> None:
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "state",
                      store=(tmp_path / "store").as_uri(), machine_id="m1", web=True,
                      web_port=0)
    write(s.source, "projects/-p/0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b.jsonl", b'{"a":1}\n')
    url_file = s.state_dir / URL_FILE
    with running(s):
        wait_for(url_file.exists, what="the page's URL")
        assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
        url = url_file.read_text().strip()
        hostport = url.split("/")[2]
        assert hostport.startswith("127.0.0.1:")
        c = http.client.HTTPConnection(*hostport.split(":"), timeout=30)
        c.request("GET", "/api/dashboard", headers={"Host": hostport})
        r = c.getresponse()
        r.read()
        assert r.status == 403  # the token is needed here too
        c.request("GET", "/api/dashboard?token=" + url.rpartition("token=")[2],
                  headers={"Host": hostport})
        r = c.getresponse()
        r.read()
        assert r.status == 303 and r.getheader("Location") == "/api/dashboard"
        jar = (r.getheader("Set-Cookie") or "").split(";")[0]
        c.request("GET", "/api/dashboard", headers={"Host": hostport, "Cookie": jar})
        r = c.getresponse()
        doc = json.loads(r.read())
        assert r.status == 200 and doc["machine_id"] == "m1" and doc["running"] is True
        c.close()
        env = env_of(tmp_path)
        got = subprocess.run([sys.executable, "-m", "syncd", "web", "--url"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert got.returncode == 0 and got.stdout.strip() == url
    assert not url_file.exists()  # stopped: no URL of a page that is gone
    # The requests it made are in its state (added at stop).
    st = State(s.state_file, readonly=True)
    try:
        counts = counted(st)
    finally:
        st.close()
    assert counts["PUT"] >= 1 and counts["since"] is not None


def test_web_url_without_a_daemon_serving_is_bad_usage(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "syncd", "web", "--url"], env=env_of(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "serves no page" in r.stderr
