// Shows times in the reader's own zone and counts down to sale starts and
// payment deadlines. Pages work without it: the server renders UTC text.
(function () {
  function pad(n) { return String(n).padStart(2, "0"); }
  function update() {
    document.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      var local = at.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short", timeZoneName: "short" });
      if (el.hasAttribute("data-countdown")) {
        var left = Math.max(0, Math.floor((at - Date.now()) / 1000));
        var h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
        el.textContent = local + " (in " + (h > 0 ? h + ":" : "") + pad(m) + ":" + pad(s) + ")";
      } else {
        el.textContent = local;
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { update(); setInterval(update, 1000); });
})();
