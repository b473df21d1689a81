// Refreshes the dashboard's figures every few seconds from /api/dashboard: text only
// (textContent), so nothing the store says can become markup.
"use strict";
(function () {
  const EVERY = 5000;
  function ago(s) {
    if (s === null || s === undefined) return "unknown";
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (s >= size) return Math.round(s / size) + unit;
    }
    return Math.round(s) + "s";
  }
  function when(t) {
    if (t === null || t === undefined) return "-";
    const d = new Date(t * 1000), p = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " +
      p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }
  function size(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? n + " B" : n.toFixed(1) + " " + units[i];
  }
  function set(name, text) {
    for (const el of document.querySelectorAll('[data-field="' + name + '"]')) {
      el.textContent = text;
    }
  }
  function show(s) {
    set("health", s.health.length ? s.health.join(", ") : "ok");
    const card = document.querySelector('[data-field="health"]');
    if (card && card.parentElement) {
      card.parentElement.classList.toggle("ok", !s.health.length);
      card.parentElement.classList.toggle("bad", !!s.health.length);
    }
    set("daemon", s.running ? "running (pid " + s.daemon_pid + ")" : "not running");
    set("lag", ago(s.lag_seconds));
    set("last_flush", when(s.last_flush_time));
    set("files", s.files_tracked + " tracked, " + s.files_deleted + " deleted locally");
    set("shipped", size(s.bytes_shipped));
    set("pending", s.bytes_pending === null ? "unknown" :
      s.files_pending + " files, " + size(s.bytes_pending));
    set("errors", String(s.errors_last_hour));
    set("store_state", s.store_reachable === true ? "(reachable)" :
      s.store_reachable === false ? "(unreachable)" : "");
    if (s.cost) {
      set("cost_total", "$" + s.cost.total.toFixed(4));
      set("cost_requests", "$" + s.cost.requests.toFixed(4));
      set("cost_storage", "$" + s.cost.storage.toFixed(4));
    }
    const list = document.getElementById("problems");
    if (list) {
      list.replaceChildren();
      for (const p of s.problems.length ? s.problems : ["none"]) {
        const li = document.createElement("li");
        li.textContent = p;
        if (!s.problems.length) li.className = "muted";
        list.appendChild(li);
      }
    }
    // Each followed machine's lag, on the row of the same machine (compared, never
    // put in a selector).
    const rows = document.querySelectorAll("#following tbody tr");
    (s.following || []).forEach((f, i) => {
      const row = rows[i], cell = row && row.querySelector(".lag");
      if (cell && row.dataset.machine === f.machine) cell.textContent = f.lag;
    });
    document.body.dataset.refreshed = String(s.now);
  }
  async function tick() {
    try {
      const r = await fetch("/api/dashboard", { credentials: "same-origin" });
      if (r.ok) show(await r.json());
    } catch (e) {
      // The server went away (stopped): the figures stay as they were.
    }
  }
  setInterval(tick, EVERY);
  tick();
})();
