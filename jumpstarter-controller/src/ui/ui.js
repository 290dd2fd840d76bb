// The dashboard's script (vendored, no build step): live updates from /ui/events, and the
// admin's actions behind the in-page confirmation dialog.
"use strict";
(function () {
  var body = document.body;
  if (!body || !body.dataset.role) { return; }
  var csrf = body.dataset.csrf || "";
  var watched = (body.dataset.watch || "").split(" ").filter(Boolean);
  var dialog = document.getElementById("confirm");
  var flash = document.getElementById("flash");
  var live = document.getElementById("live");
  var pending = null;
  var stale = false;

  function say(text, bad) {
    if (!flash) { return; }
    flash.textContent = text;
    flash.className = bad ? "bad" : "ok";
  }

  // Fetches the page's content again (the server renders it) and swaps it in.
  function refresh() {
    if (dialog && dialog.open) { stale = true; return; }
    stale = false;
    fetch(location.href, { headers: { "X-UI-Fragment": "1" }, credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 401 || r.redirected) { location.assign("/ui/login"); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null) { return; }
        var main = document.getElementById("content");
        if (main) { main.innerHTML = html; }
      })
      .catch(function () {});
  }

  var es = null;

  // The live stream. Closed when the page is left: a browser keeps a left page alive in its
  // back/forward cache, and its open stream would hold one of the few connections a browser
  // allows a server, until navigation hangs. Opened again (with the page brought up to date)
  // when such a page is shown again.
  function connect() {
    if (es || !watched.length || !window.EventSource) { return; }
    var stream = new EventSource("/ui/events");
    es = stream;
    stream.addEventListener("ready", function () { if (live) { live.className = "live on"; } });
    stream.addEventListener("change", function (ev) {
      var parts = (ev.data || "").split(" ");
      if (parts.some(function (p) { return watched.indexOf(p) >= 0; })) { refresh(); }
    });
    stream.addEventListener("logout", function () { disconnect(); location.assign("/ui/login"); });
    stream.onerror = function () {
      if (live) { live.className = "live off"; }
      // Refused (the login ended, or the controller restarted and forgot it): log in again.
      // While the controller is only unreachable the browser keeps reconnecting.
      if (stream.readyState === EventSource.CLOSED) {
        fetch("/ui/events", { credentials: "same-origin" }).then(function (r) {
          if (r.status === 401) { location.assign("/ui/login"); }
          else if (r.body && r.body.cancel) { r.body.cancel(); }
        }).catch(function () {});
      }
    };
  }

  function disconnect() {
    if (es) { es.close(); es = null; }
    if (live) { live.className = "live off"; }
  }

  connect();
  window.addEventListener("pagehide", disconnect);
  window.addEventListener("pageshow", function (ev) {
    if (ev.persisted) { connect(); refresh(); }
  });

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest ? ev.target.closest("button[data-action]") : null;
    if (!b || !dialog) { return; }
    ev.preventDefault();
    pending = b.dataset.url;
    var text = document.getElementById("confirm-text");
    if (text) { text.textContent = b.dataset.confirm || "Are you sure?"; }
    if (dialog.showModal) { dialog.showModal(); } else { dialog.setAttribute("open", ""); }
  });

  function close() {
    if (dialog.close) { dialog.close(); } else { dialog.removeAttribute("open"); }
    if (stale) { refresh(); }
  }

  if (dialog) {
    document.getElementById("confirm-no").addEventListener("click", function () {
      pending = null;
      close();
    });
    document.getElementById("confirm-yes").addEventListener("click", function () {
      var url = pending;
      pending = null;
      close();
      if (!url) { return; }
      fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/x-www-form-urlencoded" },
        body: "csrf=" + encodeURIComponent(csrf)
      })
        .then(function (r) { return r.text().then(function (t) { say(t, !r.ok); }); })
        .then(refresh)
        .catch(function (e) { say("the action failed: " + e, true); });
    });
  }
})();
