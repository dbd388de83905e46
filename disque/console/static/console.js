// disque console: live parts over server-sent events, confirmations, charts.
// Plain JavaScript, no library: pages are rendered on the server and this
// only swaps the parts the server sends again when they change.
"use strict";

(function () {
  var SVG = "http://www.w3.org/2000/svg";
  var COLOURS = ["#2b6cb0", "#c05621", "#2f855a", "#805ad5"];

  function confirmations() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var message = form.getAttribute("data-confirm");
      if (!message || form.getAttribute("data-confirmed")) return;
      event.preventDefault();
      if (!window.confirm(message)) return;
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = "confirm";
      input.value = "yes";
      form.appendChild(input);
      form.setAttribute("data-confirmed", "1");
      if (event.submitter && event.submitter.name) {
        var pressed = document.createElement("input");
        pressed.type = "hidden";
        pressed.name = event.submitter.name;
        pressed.value = event.submitter.value;
        form.appendChild(pressed);
      }
      form.submit();
    });
  }

  function tabs() {
    var bars = document.querySelectorAll("[data-tabs]");
    bars.forEach(function (bar) {
      bar.addEventListener("click", function (event) {
        var name = event.target.getAttribute("data-tab");
        if (!name) return;
        document.querySelectorAll("[data-pane]").forEach(function (pane) {
          pane.classList.toggle("hidden", pane.getAttribute("data-pane") !== name);
        });
      });
    });
  }

  function el(name, attrs, text) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // series: [{label, points: [[t, v], ...]}]
  function draw(svg, series) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var W = 600, H = 160, L = 50, B = 20, T = 18;
    var t0 = Infinity, t1 = -Infinity, top = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) {
        t0 = Math.min(t0, p[0]); t1 = Math.max(t1, p[0]); top = Math.max(top, p[1]);
      });
    });
    svg.appendChild(el("line", {x1: L, x2: W, y1: H - B, y2: H - B, "class": "axis"}));
    if (!isFinite(t0)) {
      svg.appendChild(el("text", {x: L + 10, y: H / 2, "class": "legend"}, "no samples yet"));
      return;
    }
    if (top <= 0) top = 1;
    var span = Math.max(t1 - t0, 1);
    svg.appendChild(el("text", {x: 2, y: T + 4, "class": "legend"}, formatNumber(top)));
    svg.appendChild(el("text", {x: 2, y: H - B, "class": "legend"}, "0"));
    svg.appendChild(el("text", {x: L, y: H - 4, "class": "legend"},
                       Math.round(span) + " s shown"));
    series.forEach(function (s, i) {
      var d = s.points.map(function (p) {
        var x = L + (p[0] - t0) / span * (W - L - 4);
        var y = H - B - p[1] / top * (H - B - T);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" ");
      svg.appendChild(el("polyline", {points: d, fill: "none", stroke: COLOURS[i % 4],
                                       "stroke-width": 1.5}));
      svg.appendChild(el("text", {x: L + 10 + i * 150, y: 12, fill: COLOURS[i % 4],
                                   "class": "legend"}, s.label));
    });
  }

  function formatNumber(v) {
    if (v >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return v.toFixed(v < 10 ? 1 : 0);
  }

  function charts(data) {
    document.querySelectorAll("svg.chart").forEach(function (svg) {
      var keys = (svg.getAttribute("data-series") || "").split(",");
      var series = [];
      if (Array.isArray(data)) {  // a queue's points: [{t, length, in, out}]
        keys.forEach(function (k) {
          series.push({label: k === "length" ? "length" : k + " /s",
                       points: data.map(function (p) { return [p.t, p[k]]; })});
        });
      } else {
        keys.forEach(function (k) { if (data[k]) series.push(data[k]); });
      }
      draw(svg, series);
    });
  }

  function streamUrl(live) {
    var path = window.location.pathname;
    if (live === "queue") return "/events/queue/" + path.slice("/queues/".length) + window.location.search;
    if (live === "job") return "/events/job/" + path.slice("/jobs/".length);
    return "/events/" + live + window.location.search;
  }

  function live() {
    var name = document.body.getAttribute("data-live");
    if (!name || !window.EventSource) return;
    var problem = document.getElementById("live-problem");
    var source = new EventSource(streamUrl(name));
    source.addEventListener("swap", function (event) {
      var part = JSON.parse(event.data);
      var target = document.getElementById(part.target);
      if (target) target.innerHTML = part.html;
      if (problem) problem.classList.add("hidden");
    });
    source.addEventListener("chart", function (event) { charts(JSON.parse(event.data)); });
    source.addEventListener("problem", function (event) {
      if (!problem) return;
      problem.textContent = JSON.parse(event.data).message;
      problem.classList.remove("hidden");
    });
    source.addEventListener("expired", function () {
      source.close();
      window.location.href = "/login";
    });
    window.addEventListener("beforeunload", function () { source.close(); });
  }

  // Parts with their own stream (a task's progress): data-stream names it.
  function streams() {
    document.querySelectorAll("[data-stream]").forEach(function (part) {
      if (!window.EventSource) return;
      var source = new EventSource(part.getAttribute("data-stream"));
      source.addEventListener("swap", function (event) {
        var update = JSON.parse(event.data);
        var target = document.getElementById(update.target);
        if (target) target.innerHTML = update.html;
      });
      source.addEventListener("expired", function () { source.close(); });
      window.addEventListener("beforeunload", function () { source.close(); });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmations();
    tabs();
    live();
    streams();
  });
})();
