(function () {
  "use strict";
  var root = document.documentElement;
  var table = document.getElementById("results-table");
  if (table) {
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.forEach(function (r, i) { r._i = i; r._text = r.textContent.toLowerCase(); });
    var q = document.getElementById("results-filter");
    var sel = Array.prototype.slice.call(document.querySelectorAll("select[data-filter]"));
    var count = document.getElementById("results-count");
    var apply = function () {
      var needle = q ? q.value.trim().toLowerCase() : "";
      var terms = needle ? needle.split(/\s+/) : [];
      var shown = 0;
      rows.forEach(function (r) {
        var ok = true;
        for (var t = 0; t < terms.length && ok; t++) { ok = r._text.indexOf(terms[t]) !== -1; }
        for (var s = 0; s < sel.length && ok; s++) {
          var v = sel[s].value;
          if (v) { ok = r.getAttribute("data-" + sel[s].getAttribute("data-filter")) === v; }
        }
        r.hidden = !ok;
        if (ok) { shown++; }
      });
      if (count) { count.textContent = shown + " of " + rows.length + " rows"; }
    };
    if (q) {
      q.addEventListener("input", apply);
      // A link like report.html#q=tiny-bert%20late opens with the filter applied.
      var m = /^#q=(.*)$/.exec(window.location.hash || "");
      if (m) { try { q.value = decodeURIComponent(m[1]); } catch (e) { q.value = m[1]; } }
    }
    sel.forEach(function (s) { s.addEventListener("change", apply); });
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    heads.forEach(function (th, col) {
      th.setAttribute("tabindex", "0");
      var sort = function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        var numeric = th.classList.contains("num");
        var key = function (r) {
          var c = r.cells[col];
          if (numeric) {
            var v = parseFloat(c.getAttribute("data-v"));
            return isNaN(v) ? null : v;
          }
          return c.textContent;
        };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (x === null || x === "") { return (y === null || y === "") ? a._i - b._i : 1; }
          if (y === null || y === "") { return -1; }
          var c = numeric ? x - y : x.localeCompare(y, undefined, {numeric: true});
          return c !== 0 ? dir * c : a._i - b._i;
        });
        var frag = document.createDocumentFragment();
        rows.forEach(function (r) { frag.appendChild(r); });
        tbody.appendChild(frag);
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); }
      });
    });
    apply();
  }
  var checkImages = function () {
    var imgs = document.images, ok = 0, bad = [];
    for (var i = 0; i < imgs.length; i++) {
      if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; } else { bad.push(imgs[i].alt || String(i)); }
    }
    root.setAttribute("data-images-total", String(imgs.length));
    root.setAttribute("data-images-ok", String(ok));
    root.setAttribute("data-images-bad", bad.join("|"));
  };
  if (document.readyState === "complete") { checkImages(); }
  else { window.addEventListener("load", checkImages); }
  root.setAttribute("data-ready", "1");
})();
