// flow console: live regions and local times. The console's only script, served from
// /ui/assets/live.js under `script-src 'self'`: no inline code, no eval, no HTML built
// from strings. Every page works without it (a "Refresh" link reloads by hand).
//
// Live regions. A page that wants them names its stream on <body>
// (data-live-stream="/ui/events?…", data-live-types="run. tool_call." — event type
// prefixes that concern it, data-live-url — the page to fetch again, default this one,
// data-live-gap — the fewest ms between two fetches, default 1000) and marks regions
// with data-live="name". On a relevant event the page is fetched again (same session)
// and each region is replaced by its namesake in the fresh page, unless the user is
// working in it:
//   - the focused element is inside the region, or
//   - a text field inside it (text input, textarea) is not empty.
// Such a region is kept as it is and tried again at the next event (or when focus
// leaves it). Checked checkboxes and open <details> of a replaced region are carried
// over to the fresh one by name/value and id, so a selection survives an update; a
// row that left the list takes its checkbox with it.
//
// Times. <time datetime="…"> elements show a relative time rendered by the server; the
// script puts the absolute time in the viewer's own time zone in their title (the
// server wrote UTC there).
(function () {
  "use strict";

  function localTimes(root) {
    var times = root.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var t = times[i];
      var d = new Date(t.getAttribute("datetime"));
      if (isNaN(d.getTime()) || t.hasAttribute("data-local")) continue;
      var utc = t.getAttribute("title") || "";
      t.setAttribute("title", d.toLocaleString() + (utc ? " (" + utc + ")" : ""));
      t.setAttribute("data-local", "");
    }
  }

  function isTextField(el) {
    if (el.tagName === "TEXTAREA") return true;
    if (el.tagName !== "INPUT") return false;
    var type = (el.getAttribute("type") || "text").toLowerCase();
    return ["text", "search", "number", "email", "url", "tel", "password"].indexOf(type) >= 0;
  }

  // Whether the user is working in `region`: focus inside it, or a non-empty text field.
  function inUse(region) {
    var active = document.activeElement;
    if (active && active !== document.body && region.contains(active)) return true;
    var fields = region.querySelectorAll("input, textarea");
    for (var i = 0; i < fields.length; i++) {
      if (isTextField(fields[i]) && fields[i].value !== "") return true;
    }
    return false;
  }

  // Carries checked boxes (by id, else by name and value) and open <details> (by id)
  // from `old` into `fresh`.
  function carryOver(old, fresh) {
    var boxes = old.querySelectorAll("input[type=checkbox]");
    for (var i = 0; i < boxes.length; i++) {
      var b = boxes[i];
      var twins = b.id
        ? fresh.querySelectorAll("input[type=checkbox][id='" + b.id.replace(/'/g, "") + "']")
        : fresh.querySelectorAll("input[type=checkbox]:not([id])");
      for (var j = 0; j < twins.length; j++) {
        if (twins[j].name === b.name && twins[j].value === b.value) twins[j].checked = b.checked;
      }
    }
    var open = old.querySelectorAll("details[id]");
    for (var k = 0; k < open.length; k++) {
      var twin = fresh.querySelector("details[id='" + open[k].id.replace(/'/g, "") + "']");
      if (twin) twin.open = open[k].open;
    }
  }

  function selectAll(root) {
    var all = root.querySelectorAll("input[data-select-all]");
    for (var i = 0; i < all.length; i++) {
      // Useless without this script, so the page renders it hidden.
      if (all[i].parentElement) all[i].parentElement.hidden = false;
      all[i].addEventListener("change", function (ev) {
        var scope = document.querySelector(ev.target.getAttribute("data-select-all"));
        if (!scope) return;
        var boxes = scope.querySelectorAll("input[type=checkbox][name=call]");
        for (var j = 0; j < boxes.length; j++) boxes[j].checked = ev.target.checked;
      });
    }
  }

  var body = document.body;
  localTimes(document);
  selectAll(document);
  var src = body.getAttribute("data-live-stream");
  if (!src || !window.EventSource || !window.fetch || !window.DOMParser) return;
  var types = (body.getAttribute("data-live-types") || "").split(/\s+/).filter(Boolean);
  var url = body.getAttribute("data-live-url") || window.location.href;
  // At most one re-fetch per this many ms, however busy the ledger is.
  var gap = parseInt(body.getAttribute("data-live-gap") || "1000", 10);
  var last = 0;
  var status = document.querySelector("[data-live-status]");
  var busy = false;
  var again = false;
  var timer = null;
  var kept = false;
  var stream = null;

  function say(text) {
    if (status) status.textContent = text;
  }

  function relevant(type) {
    if (!types.length) return true;
    for (var i = 0; i < types.length; i++) if (type.indexOf(types[i]) === 0) return true;
    return false;
  }

  function schedule() {
    if (timer !== null) return;
    var wait = Math.max(250, last + gap - Date.now());
    timer = window.setTimeout(refresh, wait);
  }

  function swap(doc) {
    var regions = document.querySelectorAll("[data-live]");
    var left = false;
    for (var i = 0; i < regions.length; i++) {
      var old = regions[i];
      var name = old.getAttribute("data-live");
      var fresh = doc.querySelector("[data-live='" + name.replace(/'/g, "") + "']");
      if (!fresh) continue;
      if (inUse(old)) {
        old.setAttribute("data-live-kept", "");
        left = true;
        continue;
      }
      var node = document.importNode(fresh, true);
      carryOver(old, node);
      old.replaceWith(node);
      localTimes(node);
      selectAll(node);
    }
    kept = left;
    if (doc.title) document.title = doc.title;
    var at = new Date().toLocaleTimeString();
    say(left ? "Updated " + at + " (a section you are working in was kept)" : "Updated " + at);
    body.setAttribute("data-live-updated", String(Date.now()));
  }

  function refresh() {
    timer = null;
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    last = Date.now();
    window
      .fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "text/html" } })
      .then(function (resp) {
        if (resp.redirected || !resp.ok) {
          // Signed out, or the page is gone: stop, and leave the page as it is.
          disconnect();
          say("Live updates stopped: use Refresh");
          return null;
        }
        return resp.text();
      })
      .then(function (html) {
        if (html !== null) swap(new DOMParser().parseFromString(html, "text/html"));
      })
      .catch(function () {
        say("Could not update: use Refresh");
      })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          schedule();
        }
      });
  }

  function connect() {
    stream = new EventSource(src);
    stream.onopen = function () {
      say("Live");
    };
    stream.onerror = function () {
      say(stream.readyState === EventSource.CLOSED ? "Live updates stopped: use Refresh" : "Reconnecting…");
    };
    stream.onmessage = function (ev) {
      var e;
      try {
        e = JSON.parse(ev.data);
      } catch (err) {
        return;
      }
      if (e && typeof e.type === "string" && relevant(e.type)) schedule();
    };
  }

  function disconnect() {
    if (stream) stream.close();
    stream = null;
  }

  // A stream holds one of the few connections a browser opens to a server (six over
  // HTTP/1.1), so only a page in view keeps one: a hidden tab or a page being left
  // lets it go at once, and one coming back connects again and catches up.
  connect();
  window.addEventListener("pagehide", disconnect);
  window.addEventListener("pageshow", function (ev) {
    if (ev.persisted && !document.hidden) {
      connect();
      schedule();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      disconnect();
      say("Paused while this tab is hidden");
    } else if (!stream) {
      connect();
      schedule();
    }
  });
  // A region kept while the user worked in it is tried again once they leave it.
  document.addEventListener("focusout", function () {
    if (kept) window.setTimeout(function () { if (kept) schedule(); }, 300);
  });
})();
