// The planner page (see explorer.py): the request form, the ranked layouts, memory per rank and
// the timeline of one step for the selected layout, and the schedules with abstract costs.
// Every number comes from planner.js (window.PPPlanner), the port of ppbook.planner that
// tests/test_explorer.py proves equal to the Python; this file only reads the form and draws.
(function () {
  "use strict";
  const P = window.PPPlanner;
  const data = JSON.parse(document.getElementById("ppx-data").textContent);
  P.load(data);
  const root = document.getElementById("ppx");
  const SVG = "http://www.w3.org/2000/svg";
  const GB = P.GB;
  const CONFIG = "config.json";  // the model select's entry for a pasted Hugging Face config
  const PARTS = P.MEMORY_KINDS;
  // Memory has a palette of its own, none of the timeline's colours (those mean F, B, I, W): greys
  // for what a rank holds all step (darkest: parameters), colours for what comes and goes with
  // the microbatches.
  const PART_COLOURS = {parameters: "#4D4D4D", gradients: "#8C8C8C", optimizer: "#C8C8C8",
                        activations: "#8E6BBF", logits: "#D9B44A", buffers: "#E78AC3"};
  const KIND_NAMES = {F: "forward", B: "full backward", I: "input-gradient backward", W: "weight-gradient backward"};
  const IDLE = "#ECECEC";  // a rank's row where it computes nothing: the bubble
  const TOP = 10;  // rows of the ranked table, as python -m ppbook.plan prints by default

  // --- small DOM helpers ----------------------------------------------------------------------
  function h(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children || []) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }
  function s(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function options(select, values, labels, keep) {
    const old = keep === undefined ? select.value : String(keep);
    select.replaceChildren(...values.map((v, i) => h("option", {value: String(v), text: labels ? labels[i] : String(v)})));
    if (values.map(String).includes(old)) select.value = old;
    return select;
  }
  function field(label, input, unit) {
    return h("label", {class: "ppx-field"}, [label + " ", input].concat(unit ? [" " + unit] : []));
  }
  function number(id, attrs) { return h("input", Object.assign({type: "number", id: id, class: "ppx-number"}, attrs || {})); }
  function dropdown(id) { return h("select", {id: id}); }
  const $ = (id) => document.getElementById(id);
  const fmt = (x) => String(Number(x.toFixed(3)));
  const gb = (x) => (x / GB).toFixed(1);
  const pct = (x) => (100 * x).toFixed(1) + "%";
  function seconds(x) { return x >= 1 ? x.toFixed(2) + " s" : (1e3 * x).toFixed(x >= 0.01 ? 1 : 2) + " ms"; }
  // the band of chapter 10 (ppbook.planner.calibration), as the command line picks it: the planner's port
  const sig = P.sig;
  function stepText(stepS, b) {
    const centre = stepS * b.factor;
    if (centre >= 1) return P.stepText(stepS, b);
    return sig(1e3 * centre) + " ms per step (" + sig(1e3 * centre * (1 + b.low)) + " to " + sig(1e3 * centre * (1 + b.high)) + " ms)";
  }

  // --- the page's structure -------------------------------------------------------------------
  const modes = h("div", {class: "ppx-modes", role: "radiogroup"}, [
    h("label", {}, [h("input", {type: "radio", name: "ppx-mode", id: "ppx-mode-plan", value: "plan", checked: true}),
                    " plan a layout for your model"]),
    h("label", {}, [h("input", {type: "radio", name: "ppx-mode", id: "ppx-mode-teach", value: "teach"}),
                    " schedules with abstract costs"])]);

  const modelSelect = dropdown("ppx-model");
  options(modelSelect, Object.keys(data.presets).concat([CONFIG]),
          Object.keys(data.presets).concat(["paste a Hugging Face config.json"]), data.request.model);
  const configBox = h("textarea", {id: "ppx-config", rows: 6, cols: 60, spellcheck: "false", hidden: true,
                                    placeholder: "paste the model's config.json here (from its Hugging Face page)"});
  const gpuSelect = options(dropdown("ppx-gpu"), Object.keys(data.gpus), null, data.request.gpu);
  const linkNames = Object.keys(data.links);
  const intraSelect = options(dropdown("ppx-intra"), linkNames, null, data.gpus[data.request.gpu].nvlink);
  const interSelect = options(dropdown("ppx-inter"), linkNames, null, data.gpus[data.request.gpu].network);
  const recipeSelect = options(dropdown("ppx-recipe"), data.choices.recipe, null, data.request_defaults.recipe);
  const kernelsSelect = options(dropdown("ppx-kernels"), data.choices.kernels, null, data.request_defaults.kernels);
  const frameworkSelect = options(dropdown("ppx-framework"), Object.keys(data.calibration.family),
                                  Object.keys(data.calibration.family).map((k) => k === "megatron" ? "Megatron-LM" : k),
                                  data.request_defaults.framework);

  const planSection = h("section", {id: "ppx-plan"}, [
    h("fieldset", {}, [h("legend", {text: "Model"}), field("model", modelSelect), configBox,
                       h("p", {id: "ppx-model-line", class: "ppx-note"})]),
    h("fieldset", {}, [h("legend", {text: "GPUs and links"}),
      field("GPU", gpuSelect), field("memory", number("ppx-gpu-memory", {min: 1, step: "any"}), "GB"),
      field("bf16 peak", number("ppx-gpu-tflops", {min: 1, step: "any"}), "TFLOP/s"),
      field("memory bandwidth", number("ppx-gpu-bandwidth", {min: 0.1, step: "any"}), "TB/s"), h("br"),
      field("within a node", intraSelect), field("", number("ppx-intra-bandwidth", {min: 0.1, step: "any"}), "GB/s"),
      field("", number("ppx-intra-latency", {min: 0, step: "any"}), "µs"), h("br"),
      field("between nodes", interSelect), field("", number("ppx-inter-bandwidth", {min: 0.1, step: "any"}), "GB/s"),
      field("", number("ppx-inter-latency", {min: 0, step: "any"}), "µs")]),
    h("fieldset", {}, [h("legend", {text: "Cluster and batch"}),
      field("GPUs in all", number("ppx-gpus", {min: 1, step: 1, value: data.request.gpus})),
      field("GPUs per node", number("ppx-gpus-per-node", {min: 1, step: 1, value: data.request.gpus_per_node})),
      field("global batch", number("ppx-global-batch", {min: 1, step: 1, value: data.request.global_batch}), "sequences"),
      field("sequence length", number("ppx-seq-len", {min: 1, step: 1, value: data.request.seq_len}), "tokens"),
      field("precision", recipeSelect), field("kernels", kernelsSelect),
      field("framework you will run", frameworkSelect), h("br"),
      field("pin v", h("input", {type: "text", id: "ppx-pin-v", class: "ppx-pin", placeholder: "any",
                                 title: "stages per rank to try, as --v: e.g. 5 12 (the looped schedules take each)"})),
      field("pin dp", h("input", {type: "text", id: "ppx-pin-dp", class: "ppx-pin", placeholder: "any",
                                  title: "data-parallel sizes to try, as --dp: e.g. 4 8"})),
      field("context parallel", h("input", {type: "text", id: "ppx-pin-cp", class: "ppx-pin", placeholder: "1",
                                            title: "context-parallel sizes to try, as --cp: e.g. 1 2 (each sequence " +
                                                   "split over cp GPUs; none unless given)"}))]),
    h("p", {id: "ppx-error", class: "ppx-error", role: "alert"}),
    h("p", {id: "ppx-header", class: "ppx-note"}),
    h("p", {id: "ppx-calibration", class: "ppx-note"}),
    h("p", {id: "ppx-caution", class: "ppx-note ppx-caution"}),
    h("div", {class: "ppx-table-wrap"}, [h("table", {id: "ppx-table", class: "ppx-table"})]),
    h("p", {id: "ppx-summary", class: "ppx-note"}),
    h("div", {id: "ppx-answer", class: "ppx-answer"}),
    h("div", {id: "ppx-why", class: "ppx-why"}),
    h("details", {id: "ppx-dropped-box"}, [h("summary", {text: "Why the other layouts were dropped (as --why prints it)"}),
      h("pre", {id: "ppx-dropped", class: "ppx-why-lines"})]),
    h("fieldset", {id: "ppx-layout"}, [h("legend", {text: "The selected layout (change any part)"}),
      field("tp", dropdown("ppx-tp")), field("cp", dropdown("ppx-cp")), field("p", dropdown("ppx-p")), field("schedule", dropdown("ppx-schedule")),
      field("v", dropdown("ppx-v")), field("m", dropdown("ppx-m")), field("ep", dropdown("ppx-ep")),
      field("sharding", dropdown("ppx-sharding")),
      field("recompute", dropdown("ppx-recompute")), field("balance", dropdown("ppx-balance")),
      h("span", {id: "ppx-derived", class: "ppx-note"})]),
    h("p", {id: "ppx-layout-stats", class: "ppx-stats"}),
    h("div", {id: "ppx-memory"}),
    h("div", {id: "ppx-timeline"}),
    h("details", {id: "ppx-export-box"}, [h("summary", {text: "Export the selected layout (as python -m ppbook.plan --export)"}),
      field("as", options(dropdown("ppx-export-kind"), ["torchtitan", "megatron"],
                          ["a torchtitan 0.3.0 job", "Megatron-LM arguments"], "torchtitan")),
      h("pre", {id: "ppx-export", class: "ppx-export"})])]);

  const teachSchedule = options(dropdown("ppx-t-schedule"), data.choices.schedules, null, "1F1B");
  const teachSection = h("section", {id: "ppx-teach", hidden: true}, [
    h("p", {class: "ppx-note", text: "Costs of a rank's whole share of the model: F forward, I input-gradient backward, " +
      "W weight-gradient backward (a full backward B costs I + W); a looped or V-shaped schedule cuts the share into " +
      "stages of 1/v of it. Hand-offs are free here."}),
    field("schedule", teachSchedule),
    field("p", number("ppx-t-p", {min: 2, max: 8, step: 1, value: 4})),
    field("m", number("ppx-t-m", {min: 1, max: 32, step: 1, value: 8})),
    field("v", number("ppx-t-v", {min: 2, max: 4, step: 1, value: 2})),
    field("F", number("ppx-t-F", {min: 0.1, max: 10, step: 0.5, value: 1})),
    field("I", number("ppx-t-I", {min: 0.1, max: 10, step: 0.5, value: 1})),
    field("W", number("ppx-t-W", {min: 0.1, max: 10, step: 0.5, value: 1})),
    h("p", {id: "ppx-t-stats", class: "ppx-stats"}),
    h("div", {id: "ppx-t-chart"})]);

  root.replaceChildren(modes, planSection, teachSection);
  root.dataset.plans = "0";

  // --- the request ----------------------------------------------------------------------------
  function fillGpu() {
    const g = data.gpus[gpuSelect.value];
    $("ppx-gpu-memory").value = g.memory_gb;
    $("ppx-gpu-tflops").value = g.bf16_tflops;
    $("ppx-gpu-bandwidth").value = g.hbm_tb_s;
  }
  function fillLink(side) {
    const l = data.links[$("ppx-" + side).value];
    $("ppx-" + side + "-bandwidth").value = l.bandwidth / 1e9;
    $("ppx-" + side + "-latency").value = Number((l.latency * 1e6).toPrecision(12));
  }
  function positive(id, what, integer) {
    const raw = $(id).value, x = Number(raw);
    if (raw === "" || !Number.isFinite(x) || x <= 0 || (integer && !Number.isInteger(x)))
      throw new Error(what + " must be a positive " + (integer ? "whole number" : "number") + ", not '" + raw + "'");
    return x;
  }
  function model() {
    if (modelSelect.value !== CONFIG) return Object.assign({}, data.presets[modelSelect.value]);
    const text = configBox.value.trim();
    if (!text) throw new Error("paste a Hugging Face config.json into the box (or pick a preset)");
    let config;
    try { config = JSON.parse(text); } catch (e) { throw new Error("config.json is not valid JSON: " + e.message); }
    if (config === null || typeof config !== "object" || Array.isArray(config))
      throw new Error("config.json must be a JSON object, as on the model's Hugging Face page");
    return P.fromHfConfig(config, CONFIG);
  }
  // the CLI's rule: a GPU or link with a changed number is no longer the preset (so the H100
  // measurements apply only to the H100 itself)
  function gpu() {
    const base = data.gpus[gpuSelect.value];
    const g = Object.assign({}, base, {memory_gb: positive("ppx-gpu-memory", "GPU memory"),
      bf16_tflops: positive("ppx-gpu-tflops", "bf16 peak"), hbm_tb_s: positive("ppx-gpu-bandwidth", "memory bandwidth")});
    if (g.memory_gb !== base.memory_gb || g.bf16_tflops !== base.bf16_tflops || g.hbm_tb_s !== base.hbm_tb_s)
      g.name = base.name + " (modified)";
    return g;
  }
  function link(side) {
    const base = data.links[$("ppx-" + side).value];
    const bw = positive("ppx-" + side + "-bandwidth", side + "-node bandwidth");
    const latRaw = $("ppx-" + side + "-latency").value, lat = Number(latRaw);
    if (latRaw === "" || !Number.isFinite(lat) || lat < 0) throw new Error(side + "-node latency must be 0 or more microseconds");
    if (bw === base.bandwidth / 1e9 && lat === Number((base.latency * 1e6).toPrecision(12))) return base;
    return {name: side + " (given)", latency: lat * 1e-6, bandwidth: bw * 1e9, source: "given on the page"};
  }
  function request() {
    const req = {model: model(), gpu: gpu(), gpus: positive("ppx-gpus", "GPUs in all", true),
      gpus_per_node: positive("ppx-gpus-per-node", "GPUs per node", true),
      global_batch: positive("ppx-global-batch", "global batch", true), seq_len: positive("ppx-seq-len", "sequence length", true),
      intra: link("intra"), inter: link("inter"), recipe: recipeSelect.value, kernels: kernelsSelect.value,
      vs: P.pins($("ppx-pin-v").value, "--v"), dps: P.pins($("ppx-pin-dp").value, "--dp"),
      cps: P.pins($("ppx-pin-cp").value, "--cp"), framework: frameworkSelect.value};
    if (req.gpus > req.gpus_per_node && req.gpus % req.gpus_per_node)
      throw new Error(req.gpus + " GPUs is not a whole number of nodes of " + req.gpus_per_node +
                      "; use a multiple of " + req.gpus_per_node + " (or change GPUs per node)");
    return req;
  }

  // --- planning ---------------------------------------------------------------------------------
  let planner = null, ranked = [], current = null;

  function plan() {
    $("ppx-error").textContent = "";
    let req;
    try {
      req = request();
      planner = new P.Planner(req);
      const problem = planner.requestProblem();
      if (problem) throw new Error(problem);
    } catch (e) {
      planner = null;
      $("ppx-error").textContent = e.message;
      for (const id of ["ppx-header", "ppx-calibration", "ppx-caution", "ppx-summary", "ppx-layout-stats", "ppx-dropped"])
        $(id).textContent = "";
      for (const id of ["ppx-table", "ppx-memory", "ppx-timeline", "ppx-answer", "ppx-why"]) $(id).replaceChildren();
      root.dataset.plans = String(Number(root.dataset.plans) + 1);
      return;
    }
    const m = req.model;
    $("ppx-model-line").textContent = m.name + ": " + (P.totalParameters(m) / 1e9).toFixed(2) + "B parameters" +
      (m.experts ? " (" + (P.activeParameters(m) / 1e9).toFixed(1) + "B active)" : "") + ", " + m.layers +
      " layers, hidden " + m.hidden;
    // every layout within the winner's band is ranked: the search reaches the top of the band (plan.tie_slack)
    const result = planner.plan(planner.tieSlack());
    ranked = result.ranked;
    root.dataset.request = JSON.stringify([m.name, req.gpu.name, req.gpus, req.gpus_per_node, req.global_batch, req.seq_len,
                                           req.intra.name, req.inter.name, req.framework]);
    $("ppx-header").textContent = req.gpus + " × " + req.gpu.name + " (" + fmt(req.gpu.memory_gb) + " GB, " +
      fmt(req.gpu.bf16_tflops) + " TFLOP/s bf16), " + req.gpus_per_node + " per node; links " + req.intra.name + " / " +
      req.inter.name + "; batch " + req.global_batch + " × " + req.seq_len + " tokens; usable memory " +
      gb(P.usableBytes(req)) + " GB per GPU";
    const b = planner.band();
    $("ppx-calibration").textContent = "Times printed: " + b.describe + ".";
    $("ppx-caution").textContent = b.cautions.join(" ");
    table(ranked);
    const answer = $("ppx-answer"), why = $("ppx-why");
    answer.replaceChildren(); why.replaceChildren();
    if (ranked.length) {
      const estimated = ranked.filter((o) => o.estimated).length;
      $("ppx-summary").textContent = ranked.length + " layouts ranked, " + result.dropped.length + " dropped (they do " +
        "not fit, or a schedule refuses their microbatch count); the others cannot come within " +
        Math.round(100 * planner.tieSlack()) + "% of the winner, the top of its band. Pass times: " +
        (estimated === 0 ? "measured on this GPU for every ranked layout" : estimated === ranked.length ?
          "estimated from FLOPs for every ranked layout" : "estimated from FLOPs for " + estimated + " of the " +
          ranked.length + " ranked layouts (the passes column), measured on this GPU for the others") +
        ". Click a row, or change the layout below.";
      // the answer as the command line prints it: the tie first where there is one, the winner, the margin
      planner.whyWinner(ranked).split("\n").forEach((line, i) =>
        answer.appendChild(h("p", {class: i === 0 && line.startsWith("a tie") ? "ppx-tie" : "ppx-line", text: line})));
      const lines = planner.whyLines(ranked);
      why.appendChild(h("p", {class: "ppx-note", text: "Why this layout (as python -m ppbook.plan prints it):"}));
      why.appendChild(h("pre", {class: "ppx-why-lines", text: lines.join("\n")}));
      $("ppx-dropped").textContent = P.dropSummary(result.dropped).join("\n");
      root.dataset.answer = JSON.stringify(planner.whyWinner(ranked));
      root.dataset.why = JSON.stringify(lines);
      $("ppx-export-kind").value = req.framework;
      choose(ranked[0].layout);
    } else {
      delete root.dataset.answer; delete root.dataset.why;
      $("ppx-dropped").textContent = P.dropSummary(result.dropped).join("\n");
      const closest = planner.closest(result.dropped);
      $("ppx-summary").textContent = "No layout fits: " + (closest ? "the closest, " + closest.label + ", needs " +
        gb(closest.peak_bytes) + " GB on its fullest GPU of " + gb(P.usableBytes(req)) + " usable; use more GPUs, " +
        "a larger tp, recomputation or sharding." : "every layout was refused.");
      choose(closest ? closest.layout : null);
    }
    root.dataset.plans = String(Number(root.dataset.plans) + 1);
  }

  // the selected layout as configuration: the port of plan.export (the same text, or its refusal)
  function showExport() {
    const box = $("ppx-export");
    if (!planner || !current) { box.textContent = ""; return; }
    try { box.textContent = planner.exportText(current, $("ppx-export-kind").value); }
    catch (e) { box.textContent = e.message; }
  }

  function table(rows) {
    const experts = rows.slice(0, TOP).some((o) => (o.layout.ep || 1) > 1);  // an ep column where it is used
    const context = rows.slice(0, TOP).some((o) => (o.layout.cp || 1) > 1);  // a cp column where it is used
    // narrow enough for the theme's content column: long headers on two lines, soft hyphens where
    // more is needed, and a long schedule's name may break between its words; numbers never do
    const head = ["", "tp"].concat(context ? ["cp"] : []).concat(["pp", "v", "dp"]).concat(experts ? ["ep"] : []).concat(["shard\u00ading", "sched\u00adule", "b",
      "m", "re\u00adcompute", "step", "tokens/s\nper GPU", "MFU", "bubble", "GB\nper GPU", "passes"]);
    const t = $("ppx-table");
    t.replaceChildren(h("thead", {}, [h("tr", {}, head.map((x) => h("th", {text: x})))]));
    const body = h("tbody"), b = planner.band(), tied = planner.tie(rows).length;
    rows.slice(0, TOP).forEach((o, i) => {
      const L = o.layout, inTie = tied > 1 && i < tied;
      const cells = [(i + 1) + (inTie ? "*" : ""), L.tp].concat(context ? [L.cp] : []).concat([L.p, L.v, L.dp]).concat(experts ? [(L.ep || 1) + ((L.etp || 1) > 1 ? " etp " + L.etp : "")] : []).concat([L.sharding, L.schedule, L.b, L.m,
        L.recompute, seconds(o.step_s * b.factor),
        Math.round(o.tokens_per_s_per_gpu / b.factor), Math.round(100 * o.mfu / b.factor) + "%",
        L.p === 1 ? "–" : pct(o.bubble), gb(o.peak_bytes), o.estimated ? "est." : "meas."]);
      const tr = h("tr", {tabindex: 0, "data-label": o.label, "data-step-s": o.step_s, "data-peak-bytes": o.peak_bytes,
                          "data-bubble": o.bubble, "data-tied": inTie ? "1" : "0",
                          title: o.label + (inTie ? " (tied with the winner)" : "")}, cells.map((c) => c === L.schedule ?
        h("td", {class: "ppx-name"}, String(c).split(/(?<=[a-z])(?=[A-Z][a-z])/).flatMap((w, j) => j ? [h("wbr"), w] : [w])) :
        h("td", {text: String(c)})));
      tr.addEventListener("click", () => choose(L));
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") choose(L); });
      body.appendChild(tr);
    });
    t.appendChild(body);
    if (tied > 1) t.appendChild(h("caption", {class: "ppx-note", text: "* tied: " + tied + " layouts are predicted within " +
      "the winner's band" + (tied > TOP ? " (the first " + TOP + " shown)" : "") + "; passes: pass times measured on " +
      "this GPU (meas.) or estimated from FLOPs (est.)"}));
  }

  // --- the selected layout's controls --------------------------------------------------------------
  function divisors(n) { const out = []; for (let d = 1; d <= n; d++) if (n % d === 0) out.push(d); return out; }

  function choose(L) {
    current = L;
    const name = L ? P.label(L) : null;
    for (const tr of $("ppx-table").querySelectorAll("tbody tr")) tr.classList.toggle("ppx-selected", tr.dataset.label === name);
    refreshControls();
    draw();
  }

  // the choices that make a layout of this request, around `current`
  function refreshControls() {
    if (!planner || !current) { $("ppx-layout").hidden = true; return; }
    $("ppx-layout").hidden = false;
    const req = planner.req, L = current;
    options($("ppx-tp"), planner.tensorParallelSizes(), null, L.tp);
    const cps = [...new Set(planner.contextParallelSizes(L.tp).concat([L.cp || 1]))].sort((a, b) => a - b);
    options($("ppx-cp"), cps, null, L.cp || 1);
    $("ppx-cp").disabled = cps.length < 2;
    const ranks = req.gpus / (L.tp * (L.cp || 1));
    options($("ppx-p"), divisors(ranks).filter((p) => p <= Math.min(req.model.layers, req.max_p)), null, L.p);
    const names = L.p === 1 ? [P.NO_PIPELINE] : data.choices.schedules;
    options($("ppx-schedule"), names, names.map((n) => n === P.NO_PIPELINE ? "no pipeline" : n), L.schedule);
    const kind = L.schedule === P.NO_PIPELINE ? "single" : P.placement(L.schedule);
    const tried = req.vs.length ? req.vs.filter((v) => v >= 2) : [2, 3, 4].filter((v) => v <= req.max_v);
    const vs = kind === "loop" ? [...new Set(tried.concat([L.v]))].filter((v) => v >= 2).sort((a, b) => a - b)
      : [kind === "v" ? 2 : 1];
    options($("ppx-v"), vs, null, L.v);
    $("ppx-v").disabled = kind !== "loop";
    const perReplica = req.global_batch % L.dp === 0 ? req.global_batch / L.dp : 0;
    const ms = perReplica ? divisors(perReplica) : [L.m];
    options($("ppx-m"), ms, ms.map((m) => m + " (b=" + (perReplica / m) + ")"), L.m);
    options($("ppx-ep"), planner.expertParallelSizes(L.dp, L.tp, L.cp || 1, L.etp || 1), null, L.ep || 1);
    $("ppx-ep").disabled = !req.model.experts;
    options($("ppx-sharding"), L.dp > 1 ? data.choices.sharding : ["none"], null, L.sharding);
    options($("ppx-recompute"), data.choices.recompute, null, L.recompute);
    options($("ppx-balance"), L.p > 1 ? data.choices.balance : ["even"], null, L.balance);
    $("ppx-derived").textContent = "dp = " + L.dp + ", b = " + L.b + " sequences per microbatch";
  }

  // a control moved: the layout it asks for, the other parts kept where they still make sense
  function fromControls(changed) {
    const req = planner.req, old = current;
    const tp = Number($("ppx-tp").value);
    let cp = Number($("ppx-cp").value) || 1;
    if (req.gpus % (tp * cp)) cp = 1;  // tp changed: no context parallelism that does not divide
    const ranks = req.gpus / (tp * cp);
    let p = Number($("ppx-p").value);
    if (ranks % p || p > Math.min(req.model.layers, req.max_p)) {  // tp changed: the nearest p that divides
      const ps = divisors(ranks).filter((x) => x <= Math.min(req.model.layers, req.max_p));
      p = ps.reduce((a, b) => Math.abs(b - old.p) < Math.abs(a - old.p) ? b : a);
    }
    const dp = ranks / p;
    let schedule = $("ppx-schedule").value;
    if (p === 1) schedule = P.NO_PIPELINE;
    else if (schedule === P.NO_PIPELINE) schedule = "1F1B";
    const kind = schedule === P.NO_PIPELINE ? "single" : P.placement(schedule);
    const v = kind === "loop" ? Math.max(2, Number($("ppx-v").value)) : (kind === "v" ? 2 : 1);
    let m, b;
    if (changed === "m") {
      m = Number($("ppx-m").value);
    } else {  // keep the microbatch size where it still divides: dp moves with tp and p
      b = old.b || 1;
      while (b > 1 && req.global_batch % (dp * b)) b -= 1;
      m = req.global_batch % (dp * b) ? old.m : req.global_batch / (dp * b);
    }
    b = req.global_batch / (dp * m);
    if (!Number.isInteger(b)) b = 0;  // draw() says why
    // the experts fold over tp x cp x dp (ep may exceed dp); a split of each expert (etp) is kept while it still folds
    const etp = (old.etp || 1) > 1 && (tp * cp * dp) % old.etp === 0 ? old.etp : 1;
    const eps = planner.expertParallelSizes(dp, tp, cp, etp), wanted = Number($("ppx-ep").value) || 1;
    const ep = eps.includes(wanted) ? wanted : eps.filter((e) => e <= wanted).pop() || 1;  // dp moved: the nearest below
    return P.layout(tp, p, dp, schedule, v, b, m, dp > 1 ? $("ppx-sharding").value : "none", $("ppx-recompute").value,
                    p > 1 ? $("ppx-balance").value : "even", ep, cp, etp);
  }

  for (const name of ["tp", "cp", "p", "schedule", "v", "m", "ep", "sharding", "recompute", "balance"])
    $("ppx-" + name).addEventListener("change", () => choose(fromControls(name)));

  // --- drawing the selected layout -----------------------------------------------------------------
  function draw() {
    const stats = $("ppx-layout-stats"), memory = $("ppx-memory"), chart = $("ppx-timeline");
    memory.replaceChildren(); chart.replaceChildren();
    delete memory.dataset.totals; delete memory.dataset.parts; delete chart.dataset.span; delete chart.dataset.events; delete chart.dataset.legend;
    if (!planner || !current) { stats.textContent = ""; return; }
    const req = planner.req, L = current;
    const problem = !L.b ? "the global batch " + req.global_batch + " does not split into " + L.dp + " replicas of " +
      L.m + " microbatches" : planner.constraintProblem(L);
    if (problem) {
      stats.textContent = P.label(L) + " cannot run: " + problem;
      root.dataset.layout = P.label(L);
      return;
    }
    const pred = planner.predict(L, false), b = planner.band(), k = b.factor;
    const worst = pred.memory.reduce((a, r) => r.total > a.total ? r : a);
    const usable = P.usableBytes(req), fits = worst.total <= usable;
    const win = ranked[0];
    let verdict = "";
    if (win) {
      const slower = 100 * (pred.step_s / win.step_s - 1);
      const tied = planner.tie(ranked).some((o) => o.label === P.label(L));
      verdict = P.label(win.layout) === P.label(L) ? "the planner's choice" :
        Math.abs(slower).toFixed(1) + "% " + (slower >= 0 ? "slower" : "faster") + " than the winner" +
        (tied ? ", tied with it (within its band)" : "") + (fits ? "" : ", but it does not fit");
    }
    // no bubble for a layout without a pipeline: it has none
    const passes = L.p === 1 ? "passes " + seconds(pred.pipeline_s * k) + " (no pipeline)"
      : "pipeline " + seconds(pred.pipeline_s * k) + " (bubble " + pct(pred.bubble) + ")";
    stats.textContent = P.label(L) + ": " + (fits ? "fits, " + gb(worst.total) + " GB on the fullest GPU (rank " + worst.rank + ")"
      : "does not fit: rank " + worst.rank + " needs " + gb(worst.total) + " GB of " + gb(usable) + " usable") +
      "; " + stepText(pred.step_s, b) + " (" + (pred.estimated ? "pass times estimated from FLOPs" :
        "pass times measured on this GPU (" + req.gpu.name + ")") + "): " + passes + ", data-parallel traffic not hidden " +
      seconds(pred.dp_exposed_s * k) + ", optimizer " + seconds(pred.optimizer_s * k) + "; " +
      Math.round(pred.tokens_per_s_per_gpu / k) + " tokens/s per GPU, " + Math.round(100 * pred.mfu / k) + "% MFU (calibrated)" +
      (verdict ? "; " + verdict : "");
    stats.dataset.stepS = pred.step_s;
    showExport();
    root.dataset.layout = P.label(L);
    root.dataset.layoutFields = JSON.stringify(L);
    drawMemory(memory, pred.memory, req);
    const tl = planner.timeline(L);
    // drawn in calibrated seconds, as every time printed; the axis covers the whole step: after the pipeline,
    // the rank that finishes last still waits for its data-parallel traffic not hidden and its optimizer step
    const c = pred.critical, drawnEnd = Math.max(0, ...tl.events.filter((e) => e.rank === c.rank).map((e) => e.end));
    const tail = {rank: c.rank, start: drawnEnd * k, end: (drawnEnd + pred.step_s - c.end_s) * k};
    const scaled = tl.events.map((e) => Object.assign({}, e, {start: e.start * k, end: e.end * k}));
    const axis = Math.max(tl.span * k, tail.end);
    // a long step's prediction extends from 2p and 3p microbatches; the drawing simulates all m
    const extended = Math.abs(tl.span - pred.pipeline_s) > 1e-9 * tl.span;
    const unit = axis >= 1 ? {name: "s", per: 1} : {name: "ms", per: 1e3};
    drawTimeline(chart, scaled, L.p, axis, seconds, unit,
                 "one step in calibrated seconds (the model's × " + k.toFixed(2) + "), all " + L.m +
                 " microbatches simulated" + (extended ? " (" + seconds(tl.span * k) + "; the prediction above extends 2p " +
                 "and 3p)" : ""), tail.end > tail.start ? tail : null);
    chart.dataset.span = tl.span;  // the model's own, as the command line's timeline
    chart.dataset.events = JSON.stringify(tl.events.map((e) => [e.rank, e.stage, e.kind, e.microbatch, e.start, e.end]));
    chart.dataset.axis = axis;
    chart.dataset.step = pred.step_s * k;
  }

  function drawMemory(box, ranks, req) {
    const names = ranks.map((r) => "rank " + r.rank + " (stage" + (r.stages.length > 1 ? "s " : " ") + r.stages.join(",") + ")");
    const width = 760, left = Math.max(110, 8 + 6 * Math.max(...names.map((n) => n.length))), right = 70, rowH = 20, top = 18;
    const capacity = req.gpu.memory_gb * GB, usable = P.usableBytes(req);
    const most = Math.max(capacity, ...ranks.map((r) => r.total));
    const scale = (width - left - right) / most, height = top + rowH * ranks.length + 34;
    const svg = s("svg", {width: "100%", viewBox: `0 0 ${width} ${height}`, role: "img", style: `max-width: ${width}px; height: auto`,
                          "aria-label": "memory per GPU of each pipeline rank"}, box);
    s("text", {x: 0, y: 12, "font-size": 11}, svg).textContent = "memory per GPU, by pipeline rank (GB)";
    ranks.forEach((r, i) => {
      const y = top + i * rowH;
      s("text", {x: 0, y: y + rowH / 2 + 4, "font-size": 11}, svg).textContent = names[i];
      let x = left;
      for (const part of PARTS) {
        const w = r[part] * scale;
        if (w <= 0) continue;
        const rect = s("rect", {x: x, y: y + 2, width: w, height: rowH - 4, fill: PART_COLOURS[part], class: "ppx-" + part}, svg);
        s("title", {}, rect).textContent = `rank ${r.rank}: ${part} ${gb(r[part])} GB`;
        x += w;
      }
      s("text", {x: x + 4, y: y + rowH / 2 + 4, "font-size": 10, fill: r.total > usable ? "#C44E52" : "#333"}, svg).textContent = gb(r.total);
    });
    const bottom = top + rowH * ranks.length;
    for (const [value, dash, label] of [[usable, "4 3", "usable"], [capacity, "", req.gpu.memory_gb + " GB"]]) {
      const x = left + value * scale;
      s("line", {x1: x, x2: x, y1: top - 4, y2: bottom + 2, stroke: "#222", "stroke-dasharray": dash}, svg);
      s("text", {x: x, y: bottom + 14, "font-size": 10, "text-anchor": value === usable ? "end" : "start"}, svg).textContent = label;
    }
    let lx = left;
    for (const part of PARTS) {
      s("rect", {x: lx, y: bottom + 20, width: 10, height: 10, fill: PART_COLOURS[part]}, svg);
      s("text", {x: lx + 14, y: bottom + 29, "font-size": 10}, svg).textContent = part;
      lx += 24 + 7 * part.length;
    }
    box.dataset.totals = JSON.stringify(ranks.map((r) => r.total));
    box.dataset.parts = JSON.stringify(ranks.map((r) => PARTS.map((part) => r[part])));
  }

  // one step: a row per rank, grey where it idles (the bubble), an action per box in the colours
  // of the book's other timelines, a line per hand-off; the axis in one `unit` ({name, per})
  const TAIL = "#9DB8D2";  // after the pipeline: data-parallel traffic not hidden and the optimizer step
  function drawTimeline(box, events, p, span, timeText, unit, caption, tail) {
    const width = 760, left = 56, rowH = 24, top = 8, right = 10;
    const height = top + rowH * p + 50;  // one line of legend; set again once it is drawn
    const scale = (width - left - right) / (span || 1);
    const svg = s("svg", {width: "100%", viewBox: `0 0 ${width} ${height}`, role: "img", style: `max-width: ${width}px; height: auto`,
                          "aria-label": "timeline of one step"}, box);
    for (let r = 0; r < p; r++) {
      s("text", {x: 4, y: top + r * rowH + rowH / 2 + 4, "font-size": 12}, svg).textContent = "rank " + r;
      s("rect", {x: left, y: top + r * rowH + 2, width: (width - left - right), height: rowH - 4, fill: IDLE,
                 class: "ppx-idle"}, svg);
    }
    const mid = (r) => top + r * rowH + rowH / 2;
    let handoffs = 0;
    const kinds = new Set();
    events.forEach((e) => {
      const x = left + e.start * scale, w = (e.end - e.start) * scale, y = top + e.rank * rowH;
      kinds.add(e.kind);
      const rect = s("rect", {x: x, y: y + 2, width: Math.max(w, 0.5), height: rowH - 4, fill: data.colours[e.kind],
                              stroke: "white", "stroke-width": 0.5, class: "ppx-action"}, svg);
      s("title", {}, rect).textContent = `${e.stage}${e.kind}${e.microbatch}: stage ${e.stage}, ${KIND_NAMES[e.kind]}, ` +
        `microbatch ${e.microbatch}, ${timeText(e.start)} to ${timeText(e.end)}`;
      if (w > 24) s("text", {x: x + w / 2, y: y + rowH / 2 + 4, "font-size": 10, fill: "white", "text-anchor": "middle"}, svg)
        .textContent = `${e.stage}${e.kind}${e.microbatch}`;
      else if (w > 9) s("text", {x: x + w / 2, y: y + rowH / 2 + 4, "font-size": 10, fill: "white", "text-anchor": "middle"}, svg)
        .textContent = `${e.microbatch}`;
    });
    if (tail) {
      const rect = s("rect", {x: left + tail.start * scale, y: top + tail.rank * rowH + 2, width: Math.max((tail.end - tail.start) * scale, 0.5),
                              height: rowH - 4, fill: TAIL, class: "ppx-tail"}, svg);
      s("title", {}, rect).textContent = "rank " + tail.rank + " (it finishes last): data-parallel traffic not hidden and the " +
        "optimizer step, " + timeText(tail.start) + " to " + timeText(tail.end);
    }
    events.forEach((e) => {
      if (e.from === undefined || e.from < 0) return;
      const src = events[e.from];
      handoffs += 1;
      s("line", {x1: left + src.end * scale, y1: mid(src.rank), x2: left + e.start * scale, y2: mid(e.rank),
                 stroke: "#555", "stroke-width": 0.6, "stroke-opacity": 0.7, class: "ppx-handoff"}, svg);
    });
    const axisY = top + rowH * p + 14;
    s("text", {x: 4, y: axisY, "font-size": 10}, svg).textContent = unit.name;
    for (let i = 0; i <= 4; i++)
      s("text", {x: left + (width - left - right) * i / 4, y: axisY, "font-size": 10,
                 "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle"}, svg)
        .textContent = String(Number((span * i / 4 * unit.per).toPrecision(3)));
    s("text", {x: left, y: axisY + 14, "font-size": 10}, svg).textContent = caption;
    // the legend: the kinds this step has, the hand-offs if any, and the idle time
    const legend = ["F", "B", "I", "W"].filter((k) => kinds.has(k)).map((k) => [k + " " + KIND_NAMES[k], data.colours[k]])
      .concat(handoffs ? [["hand-off between ranks", null]] : [])
      .concat(tail ? [["after the pipeline: traffic not hidden, optimizer", TAIL]] : [])
      .concat([[p > 1 ? "idle (the bubble)" : "idle", IDLE]]);
    const g = s("g", {class: "ppx-legend"}, svg);
    let lx = left, ly = axisY + 21;
    for (const [label, colour] of legend) {
      const w = 24 + 5.2 * label.length;  // a generous guess at the label's width: no text is measured
      if (lx > left && lx + w > width) { lx = left; ly += 14; }  // a second line where one is full
      if (colour) s("rect", {x: lx, y: ly, width: 10, height: 10, fill: colour}, g);
      else s("line", {x1: lx, x2: lx + 10, y1: ly + 10, y2: ly, stroke: "#555", "stroke-width": 1}, g);
      s("text", {x: lx + 14, y: ly + 9, "font-size": 10}, g).textContent = label;
      lx += w;
    }
    svg.setAttribute("viewBox", `0 0 ${width} ${ly + 14}`);  // as tall as the legend's lines
    box.dataset.span = span;
    box.dataset.actions = events.length;
    box.dataset.handoffs = handoffs;
    box.dataset.legend = JSON.stringify(legend.map(([label]) => label));
    box.dataset.events = JSON.stringify(events.map((e) => [e.rank, e.stage, e.kind, e.microbatch, e.start, e.end]));
  }

  // --- schedules with abstract costs (chapter 5's view) ---------------------------------------------
  function teach() {
    const name = teachSchedule.value, stats = $("ppx-t-stats"), chart = $("ppx-t-chart");
    const get = (id, lo, hi) => Math.min(hi, Math.max(lo, Number($(id).value) || lo));
    const p = Math.round(get("ppx-t-p", 2, 8)), m = Math.round(get("ppx-t-m", 1, 32)), v = Math.round(get("ppx-t-v", 2, 4));
    const f = get("ppx-t-F", 0.1, 10), i = get("ppx-t-I", 0.1, 10), w = get("ppx-t-W", 0.1, 10);
    const k = P.stagesPerRank(name, v);
    $("ppx-t-v").disabled = P.placement(name) !== "loop";
    chart.replaceChildren();
    chart.dataset.key = [name, p, m, k === v ? v : k, f, i, w].join("|");
    const problem = P.scheduleProblem(name, p, m, v);
    if (problem) { stats.textContent = name + " cannot run this: " + problem; return; }
    const ord = P.order(name, p, m, v);
    const events = P.simulate(ord, {F: f / k, I: i / k, W: w / k, B: (i + w) / k});
    const span = Math.max(...events.map((e) => e.end)) - Math.min(...events.map((e) => e.start));
    const busy = new Array(p).fill(0);
    events.forEach((e) => { busy[e.rank] += e.end - e.start; });
    const bubble = 1 - busy.reduce((a, x) => a + x / span, 0) / p;
    drawTimeline(chart, events.map((e) => Object.assign({from: -1}, e)), p, span, fmt, {name: "units", per: 1},
                 "time in the cost units of F, I and W (each the cost of a rank's whole share of the model)");
    const peaks = Object.entries(P.peakInFlight(ord)).map(([st, n]) => `${st}: ${n}`).join(", ");
    stats.textContent = `step time ${fmt(span)}, bubble ${pct(bubble)} of the step, ${p * k} stages; ` +
      `peak microbatches held per stage: ${peaks}`;
    stats.dataset.step = span; stats.dataset.bubble = bubble;
  }

  // --- wiring ------------------------------------------------------------------------------------
  let timer = null;
  function later(fn) { clearTimeout(timer); timer = setTimeout(fn, 250); }

  modelSelect.addEventListener("change", () => { configBox.hidden = modelSelect.value !== CONFIG; plan(); });
  configBox.addEventListener("input", () => later(plan));
  gpuSelect.addEventListener("change", () => {
    fillGpu();
    // both links follow the GPU, as the command line's defaults do: its node's link and its usual network
    intraSelect.value = data.gpus[gpuSelect.value].nvlink; fillLink("intra");
    interSelect.value = data.gpus[gpuSelect.value].network; fillLink("inter");
    plan();
  });
  intraSelect.addEventListener("change", () => { fillLink("intra"); plan(); });
  interSelect.addEventListener("change", () => { fillLink("inter"); plan(); });
  for (const id of ["ppx-gpu-memory", "ppx-gpu-tflops", "ppx-gpu-bandwidth", "ppx-intra-bandwidth", "ppx-intra-latency",
                    "ppx-inter-bandwidth", "ppx-inter-latency", "ppx-gpus", "ppx-gpus-per-node", "ppx-global-batch", "ppx-seq-len",
                    "ppx-pin-v", "ppx-pin-dp", "ppx-pin-cp"])
    $(id).addEventListener("input", () => later(plan));
  $("ppx-export-kind").addEventListener("change", showExport);
  recipeSelect.addEventListener("change", plan);
  kernelsSelect.addEventListener("change", plan);
  frameworkSelect.addEventListener("change", plan);
  teachSection.addEventListener("input", () => later(teach));
  teachSchedule.addEventListener("change", teach);
  for (const radio of root.querySelectorAll("input[name=ppx-mode]"))
    radio.addEventListener("change", () => {
      planSection.hidden = !$("ppx-mode-plan").checked;
      teachSection.hidden = !$("ppx-mode-teach").checked;
    });

  fillGpu(); fillLink("intra"); fillLink("inter");
  plan();
  teach();
})();
