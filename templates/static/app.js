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
  document.addEventListener("DOMContentLoaded", function () {
    update();
    setInterval(update, 1000);
    document.querySelectorAll("input[data-utc]").forEach(function (input) {
      echoLocal(input);
      input.addEventListener("input", function () { echoLocal(input); });
    });
  });
})();
