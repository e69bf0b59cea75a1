// The schedule explorer's drawing (see explorer.py): looks up the chosen combination in the
// precomputed data and draws it as SVG. No simulation here: every start time, the step time,
// the bubble and the peaks come from ppbook.simulate, run by the build.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("ppx-data").textContent);
  const $ = (id) => document.getElementById(id);
  const names = ["p", "m", "v", "F", "I", "W"];
  const SVG = "http://www.w3.org/2000/svg";

  function chosen() {
    const c = { schedule: $("ppx-schedule").value };
    for (const n of names) c[n] = data.grid[n][Number($("ppx-" + n).value)];
    return c;
  }

  function fmt(x) { return String(Number(x.toFixed(3))); }

  function keys(c) {
    const fixed = { single: 1, v: 2 }[data.placement[c.schedule]];
    const v = fixed === undefined ? c.v : fixed;
    const order = [c.schedule, c.p, c.m, v].join("|");
    return { order: order, entry: [order, fmt(c.F), fmt(c.I), fmt(c.W)].join("|"), v: v, looped: fixed === undefined };
  }

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, val] of Object.entries(attrs)) e.setAttribute(k, val);
    if (parent) parent.appendChild(e);
    return e;
  }

  function draw() {
    const c = chosen(), k = keys(c);
    for (const n of names) $("ppx-" + n + "-value").textContent = (n === "v" && !k.looped) ? k.v + " (fixed)" : c[n];
    $("ppx-v").disabled = !k.looped;
    const chart = $("ppx-chart"), stats = $("ppx-stats"), order = data.orders[k.order];
    chart.replaceChildren();
    if (order.error) {
      stats.textContent = c.schedule + " cannot run this: " + order.error;
      chart.dataset.key = k.entry;
      return;
    }
    const entry = data.entries[k.entry], q = data.quantum;
    const width = 760, left = 56, rowH = 26, top = 8, right = 10;
    const height = top + rowH * c.p + 34;
    const scale = (width - left - right) / (entry.step * q);
    const svg = el("svg", { width: "100%", viewBox: `0 0 ${width} ${height}`, role: "img",
                            style: `max-width: ${width}px; height: auto`,
                            "aria-label": `${c.schedule} timeline` }, chart);
    for (let r = 0; r < c.p; r++) {
      const t = el("text", { x: 4, y: top + r * rowH + rowH / 2 + 4, "font-size": 12 }, svg);
      t.textContent = "rank " + r;
    }
    order.actions.forEach(([rank, stage, kind, mb], i) => {
      const x = left + entry.start[i] * scale, w = entry.duration[kind] * scale, y = top + rank * rowH;
      const rect = el("rect", { x: x, y: y + 2, width: Math.max(w, 0.5), height: rowH - 4,
                                fill: data.colours[kind], stroke: "white", "stroke-width": 0.5 }, svg);
      el("title", {}, rect).textContent = `${stage}${kind}${mb}: stage ${stage}, ${kind}, microbatch ${mb}`;
      if (w > 22) {
        const t = el("text", { x: x + w / 2, y: y + rowH / 2 + 4, "font-size": 10, fill: "white",
                               "text-anchor": "middle" }, svg);
        t.textContent = `${stage}${kind}${mb}`;
      }
    });
    const axisY = top + rowH * c.p + 14;
    for (let i = 0; i <= 4; i++) {
      const t = el("text", { x: left + (width - left - right) * i / 4, y: axisY, "font-size": 10,
                             "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, svg);
      t.textContent = fmt(entry.step * i / 4);
    }
    el("text", { x: left, y: axisY + 14, "font-size": 10 }, svg).textContent =
      "time, in the cost units of F, I and W (each the cost of a rank's whole share of the model)";
    const peaks = Object.entries(order.peak).map(([s, n]) => `${s}: ${n}`).join(", ");
    stats.textContent = `step time ${fmt(entry.step)}, bubble ${(100 * entry.bubble).toFixed(1)}% of the step, ` +
      `${order.stages} stages; peak microbatches held per stage: ${peaks}`;
    chart.dataset.key = k.entry;
  }

  $("ppx-schedule").addEventListener("change", draw);
  for (const n of names) $("ppx-" + n).addEventListener("input", draw);
  draw();
})();
