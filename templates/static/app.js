// Shows times in the reader's own zone and counts down to sale starts and
// payment deadlines. Pages work without it: the server renders UTC text.
(function () {
  function pad(n) { return String(n).padStart(2, "0"); }
  // "2 days 1:02:03", "1:02:03", "4:05": as the server writes it (clock in
  // web/views/waiting_room/mod.rs).
  function clock(seconds) {
    var d = Math.floor(seconds / 86400), h = Math.floor((seconds % 86400) / 3600);
    var m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
    if (d > 0) return d + (d === 1 ? " day " : " days ") + h + ":" + pad(m) + ":" + pad(s);
    return h > 0 ? h + ":" + pad(m) + ":" + pad(s) : m + ":" + pad(s);
  }
  function update() {
    document.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      // dateStyle/timeStyle cannot be combined with timeZoneName, so spell the fields out.
      var local = at.toLocaleString(undefined, {
        year: "numeric", month: "short", day: "numeric",
        hour: "2-digit", minute: "2-digit", timeZoneName: "short"
      });
      if (el.hasAttribute("data-countdown")) {
        var left = Math.max(0, Math.floor((at - Date.now()) / 1000));
        el.textContent = left > 0 ? local + " (in " + clock(left) + ")" : local + " (now)";
      } else {
        el.textContent = local;
      }
    });
  }
  // The sale form takes UTC (it must work without script); echo each value
  // in the admin's own zone so a wrong hour is easy to spot.
  function echoLocal(input) {
    var out = document.getElementById(input.id + "-local");
    if (!out) return;
    var at = new Date(input.value + "Z");
    out.textContent = input.value && !isNaN(at)
      ? "In your time zone: " + at.toLocaleString(undefined, {
          weekday: "short", year: "numeric", month: "short", day: "numeric",
          hour: "2-digit", minute: "2-digit", timeZoneName: "short"
        })
      : "";
  }
  // How far the reader's clock is behind the shop's, from the page's
  // data-server-now: openings and passes run by the shop's clock.
  function skewOf(el) {
    var holder = el.closest("[data-server-now]");
    var served = holder && Date.parse(holder.getAttribute("data-server-now"));
    return served ? served - Date.now() : 0;
  }
  // A button that opens at a given second (the sale's start, the waiting
  // room's opening) enables itself then; the server still decides.
  function openAt(root) {
    root.querySelectorAll("[data-enable-at], [data-hide-at]").forEach(function (el) {
      var enable = el.hasAttribute("data-enable-at");
      var at = Date.parse(el.getAttribute(enable ? "data-enable-at" : "data-hide-at"));
      if (isNaN(at)) return;
      var wait = at - (Date.now() + skewOf(el));
      setTimeout(function () {
        if (!enable) { el.hidden = true; return; }
        el.disabled = false;
        if (el.form && el.form.classList.contains("buy")) el.textContent = "Buy now";
      }, Math.max(0, wait) + 50);
    });
  }
  // The door's bot check (ALTCHA, served by the shop): its PBKDF2 worker
  // comes from the shop's own address, as the Content-Security-Policy
  // wants. The widget script is deferred after this one, so by
  // DOMContentLoaded it has defined `$altcha`.
  function botCheck() {
    var widget = document.querySelector("altcha-widget[data-worker]");
    if (!widget || !window.$altcha) return;
    var worker = widget.getAttribute("data-worker");
    window.$altcha.algorithms.set("PBKDF2/SHA-256", function () { return new Worker(worker); });
  }
  // On a phone a table of three or more columns shows each row as a block,
  // each cell led by its column's heading (CSS: table.stacks): a table
  // scrolling inside itself hid its buttons off to the side. The labels
  // are read from the table's own headings, so no template repeats them;
  // without script a table still scrolls inside itself. A footer row
  // (a total) is left unlabelled: its cells span the columns.
  function stackTables() {
    document.querySelectorAll("table").forEach(function (table) {
      var heads = table.tHead && table.tHead.rows[0];
      if (!heads || heads.cells.length < 3) {
        // Two columns (a count and its value) fit a phone as a table, full width.
        var narrow = Array.prototype.every.call(table.rows, function (row) { return row.cells.length <= 2; });
        if (narrow) table.classList.add("fits");
        return;
      }
      var names = [];
      Array.prototype.forEach.call(heads.cells, function (th) {
        for (var i = 0; i < (th.colSpan || 1); i++) names.push(th.textContent.trim());
      });
      Array.prototype.forEach.call(table.tBodies, function (body) {
        Array.prototype.forEach.call(body.rows, function (row) {
          var column = 0;
          Array.prototype.forEach.call(row.cells, function (cell) {
            var name = names[column];
            if (name && (cell.colSpan || 1) === 1 && !cell.hasAttribute("data-label")) {
              cell.setAttribute("data-label", name);
            }
            column += cell.colSpan || 1;
          });
        });
      });
      table.classList.add("stacks");
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    stackTables();
    botCheck();
    update();
    setInterval(update, 1000);
    openAt(document);
    var room = document.getElementById("waiting-room");
    if (room) waitingRoom(room);
    document.querySelectorAll("input[data-utc]").forEach(function (input) {
      echoLocal(input);
      input.addEventListener("input", function () { echoLocal(input); });
    });
  });

  // A browser notification when it is the customer's turn, only if they
  // asked for it (the permission prompt needs their click).
  function offerNotifications(room) {
    var offer = room.querySelector(".notify");
    if (!offer || !("Notification" in window)) return;
    var state = offer.querySelector("[data-notify-state]");
    function say() {
      var permission = window.Notification.permission;
      state.textContent = permission === "granted" ? "You will be notified."
        : permission === "denied" ? "Notifications are blocked for this site in your browser." : "";
      offer.querySelector("[data-notify]").hidden = permission !== "default";
    }
    offer.hidden = false;
    say();
    offer.querySelector("[data-notify]").addEventListener("click", function () {
      var asked = window.Notification.requestPermission(say);
      if (asked && asked.then) asked.then(say);
    });
  }
  function notify(title, banner) {
    if (!("Notification" in window) || window.Notification.permission !== "granted") return;
    try {
      new window.Notification(title, { body: banner ? banner.textContent.trim() : "", tag: "flashsale-turn" });
    } catch (e) { /* some browsers only notify from a service worker: the title still says it */ }
  }

  // The waiting page: polls queue.json, writes the numbers in place, counts
  // down to the opening, the start and the pass's end by the shop's clock,
  // and swaps in the page's new section when the customer's phase changes
  // (the draw at the start, an admission, a sell-out), so nobody reloads by
  // hand. Without scripts the page refreshes itself (<noscript> meta).
  function waitingRoom(room) {
    var url = room.getAttribute("data-status-url");
    var skew = skewOf(room);
    var timer = null, failures = 0, swapFailures = 0;
    // A sell-out is not final: a refund brings units back and admits the
    // next in line, so only these stop the polling.
    var FINAL = ["bought", "lapsed", "closed"];
    offerNotifications(room);
    function tick() {
      var now = Date.now() + skew;
      room.querySelectorAll("[data-until]").forEach(function (el) {
        var at = Date.parse(el.getAttribute("data-until"));
        if (isNaN(at)) return;
        var left = Math.max(0, Math.ceil((at - now) / 1000));
        el.textContent = clock(left);
        if (left === 0 && el.getAttribute("data-at-zero") === "poll" && !el.hasAttribute("data-fired")) {
          el.setAttribute("data-fired", "");
          schedule(150);
        }
      });
      // "30 seconds left": shown, and put in the tab's title, once the
      // pass's countdown gets there.
      room.querySelectorAll("[data-show-before]").forEach(function (el) {
        var at = Date.parse(el.getAttribute("data-show-before"));
        var seconds = Number(el.getAttribute("data-seconds"));
        if (isNaN(at) || !el.hidden) return;
        var left = Math.ceil((at - now) / 1000);
        if (left <= seconds && left > 0) {
          el.hidden = false;
          document.title = seconds + " seconds left · " + document.title;
        }
      });
    }
    function show(status) {
      function put(field, text) {
        room.querySelectorAll('[data-field="' + field + '"]').forEach(function (el) {
          if (text !== null && text !== undefined) el.textContent = String(text);
        });
      }
      put("position", status.position);
      put("line_text", status.line_text);
      put("units_left", status.units_left);
      put("held", status.held);
      put("estimated_wait", status.estimated_wait_text);
      [["held_until", status.held_until], ["next_release", status.next_release_at]].forEach(function (pair) {
        if (!pair[1]) return;
        room.querySelectorAll('[data-field="' + pair[0] + '"]').forEach(function (el) {
          el.setAttribute("datetime", pair[1]);
        });
      });
      update();
    }
    // The server renders each phase's section; fetch it rather than build it here.
    // Resolves false when the shop could not answer (busy, briefly down): the
    // page stays as it is and the next poll tries again, since a reload then
    // would show the customer an error page instead of their place.
    function swap() {
      return fetch(location.href, { credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          return response.ok ? response.text() : null;
        }, function () { return null; })
        .then(function (html) {
          if (html === null) return false;
          var freshPage = new DOMParser().parseFromString(html, "text/html");
          var fresh = freshPage.getElementById("waiting-room");
          // An answer that is not a waiting page (the customer signed out
          // elsewhere, the sale is gone): only the whole page can show it.
          if (!fresh) { location.reload(); return true; }
          // DOMParser parses with scripting off, so the fresh room's
          // <noscript> fallback (a refresh every few seconds) comes out as a
          // live <meta http-equiv="refresh">: in this page it would reload
          // the page it is meant to spare.
          fresh.querySelectorAll("noscript").forEach(function (el) { el.remove(); });
          // This room's timers end with it; the fresh room starts its own.
          clearInterval(ticking);
          if (timer !== null) { clearTimeout(timer); timer = null; }
          room.replaceWith(fresh);
          // The tab's title tells a customer in another tab it is their turn.
          document.title = freshPage.title;
          var phase = fresh.getAttribute("data-phase");
          if (phase === "admitted" && room.getAttribute("data-phase") !== "admitted") {
            notify(freshPage.title, fresh.querySelector(".banner"));
          }
          update();
          openAt(fresh);
          waitingRoom(fresh);
          return true;
        });
    }
    function nextPoll(phase, status) {
      // Before the opening or the start, look again just after it.
      var target = phase === "pre_queue" ? status && status.starts_at
        : phase === "not_open_yet" ? status && status.opens_at : null;
      if (target) {
        var left = Date.parse(target) - (Date.now() + skew);
        if (left < 10000) return Math.max(250, left + 150);
      }
      if (phase === "drawing") return 700;
      if (phase === "waiting" || phase === "buying") return 2000;
      if (phase === "admitted") return 3000;
      if (phase === "sign_in") return 30000;
      return 5000;
    }
    function poll() {
      timer = null;
      // A page swapped out leaves this closure behind: it stops here.
      if (!room.isConnected) return;
      fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (!response.ok) throw new Error("queue.json answered " + response.status);
          return response.json();
        })
        .then(function (status) {
          failures = 0;
          var served = Date.parse(status.now);
          if (!isNaN(served)) skew = served - Date.now();
          // Availability has its own wording only while waiting; an
          // admitted customer's form is not swapped under their hands.
          if (status.phase !== room.getAttribute("data-phase") ||
              (status.phase === "waiting" &&
               status.availability !== room.getAttribute("data-availability"))) {
            return swap().then(function (swapped) {
              if (swapped) return;
              // Keep the numbers current meanwhile, and ask for the page
              // less often the longer it fails.
              show(status);
              swapFailures += 1;
              schedule(Math.min(30000, 2000 * Math.pow(2, Math.min(swapFailures, 4))));
            });
          }
          swapFailures = 0;
          show(status);
          if (FINAL.indexOf(status.phase) < 0) schedule(nextPoll(status.phase, status));
        })
        .catch(function () {
          // The shop may be busy or briefly down: back off, keep the page.
          failures += 1;
          schedule(Math.min(30000, 2000 * Math.pow(2, Math.min(failures, 4))));
        });
    }
    function schedule(ms) {
      if (timer !== null) clearTimeout(timer);
      timer = setTimeout(poll, ms);
    }
    var ticking = setInterval(tick, 250);
    tick();
    var phase = room.getAttribute("data-phase");
    if (FINAL.indexOf(phase) < 0) schedule(phase === "drawing" ? 300 : nextPoll(phase));
  }
})();
