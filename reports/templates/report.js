(function () {
  "use strict";
  // Hover tooltips. Text is set with textContent only: trace strings never become markup.
  var namesNode = document.getElementById("tc-timeline-names");
  var names = namesNode ? JSON.parse(namesNode.textContent) : [];
  var tip = document.getElementById("tc-tip");
  function fmtUs(v) {
    if (v >= 1e6) { return (v / 1e6).toFixed(2) + " s"; }
    if (v >= 1e3) { return (v / 1e3).toFixed(2) + " ms"; }
    return v.toFixed(1) + " \u00b5s";
  }
  function textFor(el) {
    if (el.hasAttribute("data-n")) {
      var name = names[Number(el.getAttribute("data-n"))] || "?";
      var dur = Number(el.getAttribute("data-d"));
      var count = Number(el.getAttribute("data-c") || "1");
      if (count > 1) {
        return count + " kernels merged (downsampled), " + fmtUs(dur) + " of kernel time\nlongest: " + name;
      }
      return name + "\n" + fmtUs(dur);
    }
    return el.getAttribute("data-tip");
  }
  function show(event) {
    var el = event.target.closest("[data-n],[data-tip]");
    if (!el || !tip) { return; }
    tip.textContent = textFor(el);
    tip.style.display = "block";
    var x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = event.clientY + 16;
    if (y + tip.offsetHeight > window.innerHeight) { y = event.clientY - tip.offsetHeight - 10; }
    tip.style.left = Math.max(x, 4) + "px";
    tip.style.top = Math.max(y, 4) + "px";
  }
  function hide(event) {
    var el = event.target.closest("[data-n],[data-tip]");
    if (el && tip) { tip.style.display = "none"; }
  }
  document.addEventListener("mouseover", show);
  document.addEventListener("mousemove", show);
  document.addEventListener("mouseout", hide);
  // A link to a folded group opens it.
  function openTarget() {
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }
  window.addEventListener("hashchange", openTarget);
  // The same link clicked again after its group was folded changes no hash: open it on the click.
  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[href^='#']") : null;
    var target = link ? document.getElementById(link.getAttribute("href").slice(1)) : null;
    if (target && target.tagName === "DETAILS") { target.open = true; }
  });
  openTarget();
  // A printout cannot be clicked: show the folded details (hardware, rules, assumptions).
  window.addEventListener("beforeprint", function () {
    var folded = document.querySelectorAll("details");
    for (var i = 0; i < folded.length; i++) { folded[i].open = true; }
  });
})();
