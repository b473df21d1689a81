// The session pages: the copy button of the resume line, a long transcript's further parts
// loaded on demand, and a live session's transcript reloaded when it grows (polling its
// size). No inline script: CSP script-src 'self'.
"use strict";
(function () {
  document.querySelectorAll("[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-copy"));
      if (!source || !navigator.clipboard) { return; }
      navigator.clipboard.writeText(source.textContent).then(function () {
        var note = document.getElementById("copied");
        if (note) { note.hidden = false; }
      });
    });
  });

  var box = document.getElementById("transcript");
  if (!box) { return; }

  // A long transcript comes in parts: "show the next part" / "show all the rest" fetch
  // the fragment from there and put it where the link was.
  function fragmentUrl(query) {
    return box.getAttribute("data-fragment-url") + "?" + query;
  }
  function load(more, all) {
    var params = new URLSearchParams(box.getAttribute("data-at") ? {at: box.getAttribute("data-at")} : {});
    params.set("from", more.getAttribute("data-from"));
    if (all) { params.set("all", "1"); }
    more.classList.add("loading");
    return fetch(fragmentUrl(params.toString()), {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        // The server's fragment: escaped, and no script in it runs (CSP).
        if (html !== null && more.isConnected) { more.outerHTML = html; }
      });
  }
  box.addEventListener("click", function (event) {
    var a = event.target.closest ? event.target.closest("a") : null;
    if (!a) { return; }
    var more = a.closest(".more");
    if (more) {
      event.preventDefault();
      load(more, a.classList.contains("more-all"));
      return;
    }
    // A link to a subagent's section not loaded yet: load the rest, then go there.
    var id = (a.getAttribute("href") || "").charAt(0) === "#" ? a.getAttribute("href").slice(1) : "";
    var last = box.querySelector(".more");
    if (id && !document.getElementById(id) && last) {
      event.preventDefault();
      load(last, true).then(function () {
        var target = document.getElementById(id);
        if (target) { target.scrollIntoView(); location.hash = id; }
      });
    }
  });

  if (!box.getAttribute("data-size-url")) { return; }
  // This machine's file is a stat; another machine's size reads its head from the store.
  var every = parseInt(box.getAttribute("data-every"), 10) || 2000;
  // A big transcript takes the server a while to render: the next poll waits at least
  // five times as long as the last reload took, so a session being written never keeps
  // the server rendering.
  var wait = every;
  function poll() {
    if (document.hidden) { setTimeout(poll, every); return; }
    var started = Date.now();
    var reloaded = false;
    fetch(box.getAttribute("data-size-url"), {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (doc) {
        if (!doc || doc.size === null || String(doc.size) === box.getAttribute("data-size")) {
          return null;
        }
        reloaded = true;
        // What the page shows again: the parts loaded so far, or all of it.
        var more = box.querySelector(".more");
        var query = more ? "upto=" + more.getAttribute("data-from") : "all=1";
        return fetch(fragmentUrl(query), {credentials: "same-origin", cache: "no-store"})
          .then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) {
            if (html === null) { return; }
            // The server's fragment: escaped, and no script in it runs (CSP).
            box.innerHTML = html;
            box.setAttribute("data-size", String(doc.size));
            var size = document.getElementById("session-size");
            if (size) { size.textContent = readable(doc.size); }
          });
      })
      .catch(function () { /* the next poll tries again */ })
      .then(function () {
        if (reloaded) { wait = Math.max(every, 5 * (Date.now() - started)); }
        setTimeout(poll, wait);
      });
  }
  function readable(n) {  // as the pages' size filter prints it
    var units = ["B", "KB", "MB", "GB", "TB"];
    for (var i = 0; i < units.length; i++) {
      if (n < 1024 || i === units.length - 1) {
        return i === 0 ? n + " B" : n.toFixed(1) + " " + units[i];
      }
      n /= 1024;
    }
  }
  setTimeout(poll, every);
})();
