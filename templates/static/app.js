// Shows times in the reader's own zone and counts down to sale starts and
// payment deadlines. Pages work without it: the server renders UTC text.
(function () {
  function pad(n) { return String(n).padStart(2, "0"); }
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
        var h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
        el.textContent = left > 0
          ? local + " (in " + (h > 0 ? h + ":" + pad(m) : m) + ":" + pad(s) + ")"
          : local + " (now)";
      } else {
        el.textContent = local;
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { update(); setInterval(update, 1000); });
})();
