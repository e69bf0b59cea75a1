/* The book's planner, ported to JavaScript for the planner page of the site (book/explorer.md).
 *
 * A line-by-line port of the torch-free Python planner (src/ppbook/planner: schedules.py,
 * simulate.py, shapes.py, memory.py, traffic.py, costs.py, hardware.py, search.py), so that the
 * page answers in the reader's browser, offline and from file://, what `python -m ppbook.plan`
 * answers, and of plan.py's answer (the tie, the why-lines, when a pipeline pays, the exports), so
 * that the page prints the command line's lines. The data it starts from (presets, GPUs, links, the
 * H100 measurements, the fitted efficiencies, the bands computed from the published runs) is
 * exported by the Python package itself (ppbook.explorer.planner_data), never typed here.
 * tests/test_explorer.py runs both on a grid of requests and layouts and requires the same answers
 * (memory, step time, bubble, ranking, the answer's lines) to 1e-9.
 *
 * Names follow the Python ones (camelCase); each function says which one it ports.
 */
(function (root) {
  "use strict";

  // --- schedules.py ------------------------------------------------------------------------------------
  var TORCH_SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
    "ZBVZeroBubble", "DualPipeV"];
  var PLACEMENT = {"GPipe": "single", "1F1B": "single", "Interleaved1F1B": "loop", "LoopedBFS": "loop",
    "InterleavedZeroBubble": "loop", "ZBVZeroBubble": "v", "DualPipeV": "v"};
  var SPLIT_BACKWARD = ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"];
  var NO_PIPELINE = "none";

  function act(stage, kind, mb) { return {stage: stage, kind: kind, microbatch: mb}; }

  function placement(name) {
    if (!(name in PLACEMENT)) throw new Error("unknown schedule " + name);
    return PLACEMENT[name];
  }

  function stagesPerRank(name, v) { return {single: 1, loop: v, v: 2}[placement(name)]; }

  function stageToRank(name, p, v) {
    var n = p * stagesPerRank(name, v), out = {};
    for (var s = 0; s < n; s++) out[s] = placement(name) === "v" ? (s < p ? s : 2 * p - 1 - s) : s % p;
    return out;
  }

  function stageIndices(name, rank, p, v) {
    var map = stageToRank(name, p, v), out = [];
    for (var s = 0; s < p * stagesPerRank(name, v); s++) if (map[s] === rank) out.push(s);
    return out;
  }

  function assignLayers(nLayers, numStages) {
    if (numStages < 1) throw new Error("num_stages must be at least 1");
    if (nLayers < numStages) throw new Error("cannot give " + numStages + " stages a layer each from " + nLayers);
    var base = Math.floor(nLayers / numStages), extra = nLayers % numStages, out = [], start = 0;
    for (var st = 0; st < numStages; st++) {
      var size = base + (st < extra ? 1 : 0), run = [];
      for (var i = start; i < start + size; i++) run.push(i);
      out.push(run);
      start += size;
    }
    return out;
  }

  // port of schedule_problem: null when torch accepts (p, m, v), else the reason (in the words of
  // the book's scripts, whose flags it names)
  function scheduleProblem(name, p, m, v, layers) {
    if (placement(name) === "loop" && v < 2)
      return name + " needs at least 2 stages per rank, got --stages-per-rank " + v + "; use 2 or more, or Schedule1F1B";
    var total = p * stagesPerRank(name, v);
    if (layers !== undefined && layers !== null && layers < total)
      return name + " on " + p + " processes has " + total + " stages of at least one layer each, but --layers is " +
        layers + "; raise --layers to " + total + " or more";
    if (name === "1F1B" && m < p)
      return "Schedule1F1B needs at least as many microbatches as stages (" + p + "), got --microbatches " + m +
        "; use " + p + " or more";
    if (name === "DualPipeV" && m < total)
      return "ScheduleDualPipeV needs at least as many microbatches as stages (2 x " + p + " = " + total +
        "), got --microbatches " + m + "; use " + total + " or more";
    if (name === "Interleaved1F1B" || name === "InterleavedZeroBubble") {
      var rounds = Math.max(1, Math.floor(m / p));
      if (m % rounds) {
        var ok = [];
        for (var k = 1; k <= 4 * m; k++) if (k !== m && k % Math.max(1, Math.floor(k / p)) === 0) ok.push(k);
        // Python's sorted(key=abs(k - m)) is stable: ties keep increasing k
        ok.sort(function (a, b) { return Math.abs(a - m) - Math.abs(b - m) || a - b; });
        ok = ok.slice(0, 2).sort(function (a, b) { return a - b; });
        return "Schedule" + name + " splits the microbatches into m // p = " + rounds + " rounds of equal size, so " +
          "--microbatches " + m + " must be a multiple of " + rounds + "; try " + ok.join(" or ");
      }
    }
    return null;
  }

  function gpipeOrder(p, m) {
    var order = {};
    for (var r = 0; r < p; r++) {
      var a = [];
      for (var i = 0; i < m; i++) a.push(act(r, "F", i));
      for (i = 0; i < m; i++) a.push(act(r, "B", i));
      order[r] = a;
    }
    return order;
  }

  function oneFOneBOrder(p, m) {
    var order = {};
    for (var r = 0; r < p; r++) {
      var warmup = Math.min(m, p - r), a = [], i;
      for (i = 0; i < warmup; i++) a.push(act(r, "F", i));
      for (i = 0; i < m - warmup; i++) { a.push(act(r, "B", i)); a.push(act(r, "F", warmup + i)); }
      for (i = m - warmup; i < m; i++) a.push(act(r, "B", i));
      order[r] = a;
    }
    return order;
  }

  function loopedBfs(rank, p, m, v) {
    var stages = [], a = [], i, k;
    for (var s = rank; s < p * v; s += p) stages.push(s);
    for (k = 0; k < stages.length; k++) for (i = 0; i < m; i++) a.push(act(stages[k], "F", i));
    for (k = stages.length - 1; k >= 0; k--) for (i = m - 1; i >= 0; i--) a.push(act(stages[k], "B", i));
    return a;
  }

  function interleaved(rank, p, m, v, zeroBubble) {
    var rounds = Math.max(1, Math.floor(m / p)), perRound = Math.floor(m / rounds);
    var warmup = Math.min((v - 1) * perRound + (zeroBubble ? 1 : 2) * (p - 1 - rank), m * v);
    var fwdBwd = v * m - warmup, total = warmup + fwdBwd + warmup;
    function fwdStage(step) { return (Math.floor(step / perRound) % v) * p + rank; }
    function bwdStage(step) { return (v - 1 - (Math.floor((step - warmup) / perRound) % v)) * p + rank; }
    var count = {F: [], B: [], I: [], W: []};
    for (var key in count) for (var j = 0; j < v; j++) count[key].push(0);
    function take(stage, kind) {
      var i = count[kind][Math.floor(stage / p)];
      count[kind][Math.floor(stage / p)] = i + 1;
      return act(stage, kind, i);
    }
    var back = zeroBubble ? "I" : "B", backwardOps = [], weights = 0, acts = [];
    function maybeWeight(op) {
      if (zeroBubble && op - warmup >= rank) {
        acts.push(take(bwdStage(backwardOps[weights]), "W"));
        weights += 1;
      }
    }
    for (var op = 0; op < total; op++) {
      if (op < warmup) { acts.push(take(fwdStage(op), "F")); continue; }
      if (op < warmup + fwdBwd) acts.push(take(fwdStage(op), "F"));
      acts.push(take(bwdStage(op), back));
      backwardOps.push(op);
      maybeWeight(op);
    }
    while (zeroBubble && weights < backwardOps.length) {
      acts.push(take(bwdStage(backwardOps[weights]), "W"));
      weights += 1;
    }
    return acts;
  }

  function zbv(rank, p, m) {
    var nMicro = Math.max(2 * p - 1, m), s0 = rank, s1 = 2 * p - 1 - rank, a = [];
    var f0 = 0, f1 = 0, b0 = 0, b1 = 0, i;
    for (i = 0; i < 2 * (p - rank) - 1; i++) a.push(act(s0, "F", f0++));
    for (i = 0; i < rank; i++) { a.push(act(s1, "F", f1++)); a.push(act(s0, "F", f0++)); }
    for (i = 0; i < p - rank; i++) {
      a.push(act(s1, "F", f1++)); a.push(act(s1, "I", b1)); a.push(act(s1, "W", b1)); b1++;
    }
    while (f1 < f0 || f0 < nMicro) {
      if (f0 < nMicro) a.push(act(s0, "F", f0++));
      a.push(act(s0, "I", b0)); a.push(act(s0, "W", b0)); b0++;
      a.push(act(s1, "F", f1++)); a.push(act(s1, "I", b1)); a.push(act(s1, "W", b1)); b1++;
    }
    var w0 = b0, w1 = b1;
    for (i = 0; i < rank; i++) { a.push(act(s0, "I", b0++)); a.push(act(s1, "I", b1++)); }
    for (i = 0; i < p - rank; i++) { a.push(act(s0, "I", b0++)); a.push(act(s0, "W", w0++)); }
    for (i = w1; i < b1; i++) a.push(act(s1, "W", i));
    for (i = w0; i < b0; i++) a.push(act(s0, "W", i));
    return a.filter(function (x) { return x.microbatch < m; });
  }

  // pairs: when given, the forward of each OVERLAP_F_B pair is pushed on it (port of overlapped_forwards)
  function dualpipev(rank, p, m, pairs) {
    var s0 = rank, s1 = 2 * p - 1 - rank, count = {}, queue = [], a = [];
    function get(key) { return count[key] || 0; }
    function add(stage, kind) {
      var key = stage + (kind === "B" ? "I" : kind), i = get(key);
      a.push(act(stage, kind, i));
      if (kind === "B") {
        count[stage + "I"] = i + 1;
        count[stage + "W"] = get(stage + "W") + 1;
      } else {
        if (kind === "I") queue.push([stage, i]);
        count[key] = i + 1;
      }
    }
    function weight() {
      if (queue.length) {
        var x = queue.shift();
        a.push(act(x[0], "W", x[1]));
        count[x[0] + "W"] = get(x[0] + "W") + 1;
      }
    }
    function overlap(fwd, bwd) { add(fwd, "F"); if (pairs) pairs.push(a[a.length - 1]); add(bwd, "B"); }
    var i;
    for (i = 0; i < (p - rank - 1) * 2; i++) add(s0, "F");
    for (i = 0; i < rank + 1; i++) { add(s0, "F"); add(s1, "F"); }
    for (i = 0; i < p - rank - 1; i++) { add(s1, "I"); weight(); add(s1, "F"); }
    for (i = 0; i < m - 2 * p + rank + 1; i++) {
      if (i === 0 && rank === p - 1) { add(s0, "F"); add(s1, "B"); } else overlap(s0, s1);
      overlap(s1, s0);
    }
    for (i = 0; i < p - rank - 1; i++) { add(s1, "B"); overlap(s1, s0); }
    var zb = false, half = Math.floor((rank + 1) / 2);
    for (i = 0; i < rank + 1; i++) {
      if (i === half && rank % 2 === 1) zb = true;
      add(s1, zb ? "I" : "B");
      if (i === half && rank % 2 === 0) zb = true;
      add(s0, zb ? "I" : "B");
    }
    for (i = 0; i < p - rank - 1; i++) { weight(); add(s0, zb ? "I" : "B"); }
    for (i = 0; i < rank + 1; i++) weight();
    return a;
  }

  // port of schedules.overlapped_forwards: the forwards run in an OVERLAP_F_B pair, as key3 strings
  function overlappedForwards(name, p, m) {
    var out = {};
    if (name !== "DualPipeV") return out;
    var pairs = [];
    for (var r = 0; r < p; r++) dualpipev(r, p, m, pairs);
    pairs.forEach(function (x) { if (x.microbatch < m) out[key3(x.stage, x.kind, x.microbatch)] = true; });
    return out;
  }

  // port of simulate.pair_slots: a DualPipeV pair's forward and backward slots, from each half's [compute, all-to-all]
  function pairSlots(f, b) { return [Math.max(f[0], b[1]), Math.max(b[0], f[1])]; }

  // port of schedules.order
  function order(name, p, m, v) {
    placement(name);
    var problem = scheduleProblem(name, p, m, v);
    if (problem) throw new Error(problem);
    if (name === "GPipe") return gpipeOrder(p, m);
    if (name === "1F1B") return oneFOneBOrder(p, m);
    var out = {};
    for (var r = 0; r < p; r++) {
      out[r] = name === "LoopedBFS" ? loopedBfs(r, p, m, v) :
        name === "Interleaved1F1B" ? interleaved(r, p, m, v, false) :
        name === "InterleavedZeroBubble" ? interleaved(r, p, m, v, true) :
        name === "ZBVZeroBubble" ? zbv(r, p, m) : dualpipev(r, p, m);
    }
    return out;
  }

  // --- dataflow.py and simulate.py -------------------------------------------------------------------------
  function key3(stage, kind, mb) { return stage + "|" + kind + "|" + mb; }

  // port of dataflow.waits_on
  function waitsOn(stage, kind, mb, numStages, has) {
    if (kind === "F") return stage > 0 ? [stage - 1, "F", mb] : null;
    if (kind === "B" || kind === "I") {
      if (stage === numStages - 1) return [stage, "F", mb];
      var dep = [stage + 1, kind, mb];
      return has(dep) ? dep : [stage + 1, kind === "B" ? "I" : "B", mb];
    }
    if (kind === "W") return [stage, "I", mb];
    throw new Error("unknown action kind " + kind);
  }

  // port of simulate.compile_order: rank by rank (ranks in increasing order), in order
  function compileOrder(ord) {
    var actions = [], ranks = [], slices = [], rs = Object.keys(ord).map(Number).sort(function (x, y) { return x - y; });
    rs.forEach(function (r) {
      slices.push([r, actions.length, actions.length + ord[r].length]);
      ord[r].forEach(function (a) { actions.push(a); ranks.push(r); });
    });
    var index = {}, numStages = 0;
    actions.forEach(function (a, i) { index[key3(a.stage, a.kind, a.microbatch)] = i; numStages = Math.max(numStages, a.stage + 1); });
    var has = function (k) { return key3(k[0], k[1], k[2]) in index; };
    var dep = [], remote = [];
    actions.forEach(function (a, i) {
      var d = waitsOn(a.stage, a.kind, a.microbatch, numStages, has);
      var j = d === null ? -1 : index[key3(d[0], d[1], d[2])];
      dep.push(j);
      remote.push(j >= 0 && ranks[j] !== ranks[i]);
    });
    return {actions: actions, ranks: ranks, slices: slices, dep: dep, remote: remote};
  }

  // port of simulate.run
  function run(c, cost, hop) {
    var n = c.actions.length, start = new Array(n).fill(0), end = new Array(n).fill(-1);
    var position = c.slices.map(function (s) { return s[1]; }), freeAt = c.slices.map(function () { return 0; });
    var remaining = n;
    while (remaining) {
      var progressed = false;
      for (var k = 0; k < c.slices.length; k++) {
        var hi = c.slices[k][2], i = position[k];
        while (i < hi) {
          var j = c.dep[i];
          if (j >= 0 && end[j] < 0) break;
          var ready = j < 0 ? 0 : end[j] + (hop && c.remote[i] ? hop[i] : 0);
          var t = Math.max(freeAt[k], ready);
          start[i] = t; end[i] = t + cost[i];
          freeAt[k] = end[i];
          i += 1; remaining -= 1; progressed = true;
        }
        position[k] = i;
      }
      if (!progressed) throw new Error("schedule deadlocks");
    }
    return [start, end];
  }

  // port of simulate.peak_in_flight (by stage): the most microbatches each stage holds at once
  function peakInFlight(ord) {
    var held = {}, peak = {}, delta = {F: 1, B: -1, W: -1};
    Object.keys(ord).forEach(function (r) {
      ord[r].forEach(function (a) {
        held[a.stage] = (held[a.stage] || 0) + (delta[a.kind] || 0);
        peak[a.stage] = Math.max(peak[a.stage] || 0, held[a.stage]);
      });
    });
    return peak;
  }

  // port of simulate.simulate with costs per kind and no latency: events in compile order
  function simulate(ord, costs) {
    var c = compileOrder(ord), se = run(c, c.actions.map(function (a) { return costs[a.kind]; }), null);
    return c.actions.map(function (a, i) {
      return {rank: c.ranks[i], stage: a.stage, kind: a.kind, microbatch: a.microbatch, start: se[0][i], end: se[1][i]};
    });
  }

  // --- shapes.py ----------------------------------------------------------------------------------------------
  function hd(s) { return s.head_dim || Math.floor(s.hidden / s.heads); }
  function isMoe(s) { return s.experts > 0; }
  function isMla(s) { return s.kv_lora_rank > 0; }
  function normParams(s, width) { return width * (s.norm === "layer" ? 2 : 1); }

  function attentionParameters(s) {
    var h = s.hidden;
    if (isMla(s)) {
      var qHead = s.qk_nope_dim + s.qk_rope_dim;
      var q = s.q_lora_rank ? h * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * s.heads * qHead : h * s.heads * qHead;
      var kv = h * (s.kv_lora_rank + s.qk_rope_dim) + s.kv_lora_rank + s.kv_lora_rank * s.heads * (s.qk_nope_dim + s.v_head_dim);
      return q + kv + s.heads * s.v_head_dim * h;
    }
    var qq = s.heads * hd(s), kvw = s.kv_heads * hd(s);
    var weights = h * qq + 2 * h * kvw + qq * h;
    var biases = s.bias ? (qq + 2 * kvw + h) : (s.qkv_bias ? (qq + 2 * kvw) : 0);
    return weights + biases;
  }

  // port of shapes.gated and its constants
  var GATED_MLPS = ["swiglu", "geglu"], MLPS = GATED_MLPS.concat(["gelu", "relu", "relu2"]);
  function gated(s) { return GATED_MLPS.indexOf(s.mlp) >= 0; }

  function mlpParameters(s, width) {
    var h = s.hidden;
    if (gated(s)) return 3 * h * width + (s.bias ? 2 * width + h : 0);
    return 2 * h * width + (s.bias ? width + h : 0);
  }

  function layerParameters(s, index) {
    var norms = 2 * normParams(s, s.hidden);
    if (isMoe(s) && index >= s.dense_layers) {
      var router = s.hidden * s.experts + (s.router_bias ? s.experts : 0);
      var experts = (s.experts + s.shared_experts) * mlpParameters(s, s.expert_ffn);
      return norms + attentionParameters(s) + router + experts;
    }
    return norms + attentionParameters(s) + mlpParameters(s, s.ffn);
  }

  // port of routed_expert_parameters
  function routedExpertParameters(s, index) {
    if (!(isMoe(s) && index >= s.dense_layers)) return 0;
    return s.experts * mlpParameters(s, s.expert_ffn);
  }

  function activeLayerParameters(s, index) {
    if (!(isMoe(s) && index >= s.dense_layers)) return layerParameters(s, index);
    var norms = 2 * normParams(s, s.hidden);
    var used = (s.top_k + s.shared_experts) * mlpParameters(s, s.expert_ffn);
    return norms + attentionParameters(s) + s.hidden * s.experts + used;
  }

  // port of shapes.block_weight_groups: the parameter groups torch's weight pass differentiates apart
  function blockWeightGroups(s, moeLayer) {
    var attention = isMla(s) ? (s.q_lora_rank ? 3 : 1) + 3 + 1 : 4, matrices = gated(s) ? 3 : 2;
    var mlp = moeLayer ? 1 + matrices + (s.shared_experts ? matrices : 0) : matrices;
    return 2 + attention + mlp;
  }

  function embeddingParameters(s) {
    var h = s.hidden;
    return s.vocab * h + (s.position === "learned" ? s.max_positions * h : 0) + (s.embed_norm ? normParams(s, h) : 0);
  }

  function headParameters(s) { return normParams(s, s.hidden) + s.vocab * s.hidden; }

  function totalParameters(s) {
    var head = headParameters(s) - (s.tied ? s.vocab * s.hidden : 0), t = embeddingParameters(s);
    for (var i = 0; i < s.layers; i++) t += layerParameters(s, i);
    return t + head;
  }

  function activeParameters(s) {
    var head = headParameters(s) - (s.tied ? s.vocab * s.hidden : 0), t = embeddingParameters(s);
    for (var i = 0; i < s.layers; i++) t += activeLayerParameters(s, i);
    return t + head;
  }

  var SHAPE_DEFAULTS = {tied: false, mlp: "swiglu", norm: "rms", bias: false, qkv_bias: false, position: "rope",
    max_positions: 0, embed_norm: false, head_dim: 0, experts: 0, top_k: 0, expert_ffn: 0, shared_experts: 0,
    dense_layers: 0, router_bias: false, q_lora_rank: 0, kv_lora_rank: 0, qk_rope_dim: 0, qk_nope_dim: 0,
    v_head_dim: 0, published_params: 0, source: ""};

  function shape(fields) {
    var s = {};
    for (var k in SHAPE_DEFAULTS) s[k] = SHAPE_DEFAULTS[k];
    for (k in fields) s[k] = fields[k];
    return s;
  }

  // port of shapes.mlp_of and its tables
  var GATED_TYPES = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "granite", "phi3", "cohere", "internlm2"];
  var TWO_MATRIX_TYPES = ["gpt2", "gpt_neox", "bloom", "opt", "gpt_bigcode", "falcon", "nemotron", "phi", "starcoder2"];
  var GPT_TYPES = ["gpt2", "gpt_neox", "bloom", "opt", "gpt_bigcode"];
  var ACTIVATIONS = {silu: "silu", swish: "silu", gelu: "gelu", gelu_new: "gelu", gelu_fast: "gelu",
    gelu_pytorch_tanh: "gelu", quick_gelu: "gelu", relu: "relu", relu2: "relu2"};
  var ACTIVATION_KEYS = ["hidden_act", "activation_function", "hidden_activation", "activation"];

  function pyRepr(x) { return "'" + x + "'"; }

  function mlpOf(kind, act, name) {
    if (act !== null && (typeof act !== "string" || !(act.toLowerCase() in ACTIVATIONS)))
      throw new Error(name + ": activation " + JSON.stringify(act) + " is not one the planner reads (" +
        Object.keys(ACTIVATIONS).join(", ") + "); give a config with one of them");
    var family = act !== null ? ACTIVATIONS[act.toLowerCase()] : null, isGated;
    if (TWO_MATRIX_TYPES.indexOf(kind) >= 0) { isGated = false; family = family || "gelu"; }
    else if (GATED_TYPES.indexOf(kind) >= 0) { isGated = true; family = family || "silu"; }
    else if (family === "silu" || family === "relu2") isGated = family === "silu";
    else throw new Error(name + ": model_type " + pyRepr(kind) + " " + (act ? "with activation " + pyRepr(act) : "without an activation") +
      ": the planner cannot tell a gated MLP (three matrices) from a plain one (two); give hidden_act and a model_type it reads (" +
      GATED_TYPES.concat(TWO_MATRIX_TYPES).join(", ") + ")");
    if (isGated) {
      if (family === "silu" || family === "gelu") return family === "silu" ? "swiglu" : "geglu";
      throw new Error(name + ": a gated MLP with " + pyRepr(act) + " is not one the planner reads; it reads SwiGLU and GeGLU");
    }
    if (family === "silu")
      throw new Error(name + ": a two-matrix MLP with " + pyRepr(act) + " is not one the planner reads; it reads GELU and ReLU");
    return family;
  }

  // port of shapes.from_hf_config
  function fromHfConfig(c, name) {
    name = name || "config.json";
    var kind = ("model_type" in c ? (c.model_type === null ? "none" : String(c.model_type)) : "llama").toLowerCase();
    function found(k) { return c[k] !== undefined && c[k] !== null; }
    function get(keys, dflt) {
      for (var i = 0; i < keys.length; i++) if (found(keys[i])) return c[keys[i]];
      if (dflt !== undefined && dflt !== null) return dflt;
      throw new Error(name + ": no '" + keys.join("' or '") + "' (model_type '" + kind + "'); give a Hugging Face config.json of a decoder-only transformer");
    }
    function whole(keys, dflt) {
      var value = get(keys, dflt);
      if (typeof value !== "number" || !Number.isInteger(value)) {
        var key = keys.filter(found)[0] || keys[0];
        throw new Error(name + ": '" + key + "' must be a whole number, got " + JSON.stringify(value));
      }
      return value;
    }
    var hidden = whole(["hidden_size", "n_embd", "n_embed", "d_model"]);
    var layers = whole(["num_hidden_layers", "n_layer", "num_layers"]);
    var heads = whole(["num_attention_heads", "n_head", "num_heads"]);
    var kv = whole(["num_key_value_heads", "multi_query_group_num", "num_kv_heads"], c.multi_query ? 1 : heads);
    var vocab = whole(["vocab_size", "padded_vocab_size"]);
    var tied = !!get(["tie_word_embeddings"], ["gpt2", "bloom", "opt", "falcon"].indexOf(kind) >= 0);
    var actKey = ACTIVATION_KEYS.filter(found)[0];
    var mlp = mlpOf(kind, actKey === undefined ? null : c[actKey], name);
    if (GPT_TYPES.indexOf(kind) >= 0) {
      var ffn = whole(["ffn_dim", "intermediate_size", "n_inner"], 4 * hidden) || 4 * hidden;
      var position = {bloom: "alibi", gpt_neox: "rope"}[kind] || "learned";
      var maxPos = whole(["n_positions", "max_position_embeddings"], 2048) + (kind === "opt" ? 2 : 0);
      return validateShape(shape({name: name, vocab: vocab, hidden: hidden, layers: layers, heads: heads, kv_heads: kv,
        ffn: ffn, tied: tied, mlp: mlp, norm: "layer", bias: true, position: position,
        max_positions: position === "learned" ? maxPos : 0, embed_norm: kind === "bloom"}));
    }
    if (kind === "falcon")
      return validateShape(shape({name: name, vocab: vocab, hidden: hidden, layers: layers, heads: heads, kv_heads: kv,
        ffn: whole(["ffn_hidden_size"], 4 * hidden), tied: tied, mlp: mlp, norm: "layer", bias: !!c.bias,
        position: c.alibi ? "alibi" : "rope"}));
    var f = whole(["intermediate_size", "ffn_hidden_size"]);
    var headDim = (found("head_dim") && c.head_dim !== Math.floor(hidden / heads)) ? (+c.head_dim || 0) : 0;
    var s = shape({name: name, vocab: vocab, hidden: hidden, layers: layers, heads: heads, kv_heads: kv, ffn: f,
      tied: tied, mlp: mlp, norm: kind === "nemotron" ? "layer" : "rms", head_dim: headDim, qkv_bias: !!(c.attention_bias || kind.indexOf("qwen2") === 0), bias: !!c.mlp_bias});
    var experts = whole(["num_local_experts", "n_routed_experts", "num_experts"], 0);
    if (experts) {
      s.experts = experts; s.top_k = whole(["num_experts_per_tok", "moe_topk"]);
      s.expert_ffn = whole(["moe_intermediate_size"], f); s.shared_experts = whole(["n_shared_experts"], 0);
      s.dense_layers = whole(["first_k_dense_replace"], 0); s.router_bias = kind === "deepseek_v3";
    }
    if (c.kv_lora_rank) {
      s.q_lora_rank = whole(["q_lora_rank"], 0); s.kv_lora_rank = whole(["kv_lora_rank"]);
      s.qk_rope_dim = whole(["qk_rope_head_dim"]); s.qk_nope_dim = whole(["qk_nope_head_dim"]); s.v_head_dim = whole(["v_head_dim"]);
    }
    return validateShape(s);
  }

  // port of shapes.validate
  function validateShape(s) {
    if (MLPS.indexOf(s.mlp) < 0) throw new Error(s.name + ": MLP '" + s.mlp + "' is not one of " + MLPS.join(", "));
    ["vocab", "hidden", "layers", "heads", "kv_heads", "ffn"].forEach(function (f) {
      if (!(s[f] >= 1)) throw new Error(s.name + ": " + f + " must be at least 1, got " + s[f]);
    });
    if (!isMla(s) && !s.head_dim && s.hidden % s.heads)
      throw new Error(s.name + ": hidden size " + s.hidden + " is not divisible by " + s.heads + " heads");
    if (s.heads % s.kv_heads)
      throw new Error(s.name + ": " + s.heads + " heads are not a multiple of " + s.kv_heads + " key/value heads");
    if (isMoe(s) && !(s.top_k > 0 && s.top_k <= s.experts))
      throw new Error(s.name + ": top_k " + s.top_k + " must be between 1 and the " + s.experts + " experts");
    return s;
  }

  // --- hardware.py and traffic.py -------------------------------------------------------------------------------
  function allreduceBytes(nbytes, n) { return 2 * (n - 1) / n * nbytes; }
  function gatherBytes(nbytes, n) { return (n - 1) / n * nbytes; }
  function linkTime(link, nbytes) { return link.latency + nbytes / link.bandwidth; }
  function linkAllreduce(link, nbytes, n) {
    return n <= 1 ? 0 : 2 * (n - 1) * link.latency + allreduceBytes(nbytes, n) / link.bandwidth;
  }
  function alltoallBytes(nbytes, n) { return (n - 1) / n * nbytes; }
  function expertDispatchBytes(b, seq, hidden, topK, dt, tp) { return b * seq * topK * hidden * dt / (tp || 1); }
  function linkAlltoall(link, nbytes, n) {
    return n <= 1 ? 0 : (n - 1) * link.latency + alltoallBytes(nbytes, n) / link.bandwidth;
  }
  function linkGather(link, nbytes, n) {
    return n <= 1 ? 0 : (n - 1) * link.latency + gatherBytes(nbytes, n) / link.bandwidth;
  }
  function boundaryBytes(b, s, h, dt) { return b * s * h * dt; }

  // --- memory.py ----------------------------------------------------------------------------------------------------
  var GB = 1e9, SHARDING = ["none", "zero1", "zero2", "fsdp"], RECOMPUTE = ["none", "selective", "full"];
  var MEMORY_KINDS = ["parameters", "gradients", "optimizer", "activations", "logits", "buffers"];
  var KERNELS = ["fused", "unfused", "book"];
  var RECIPES = {"bf16": [2, 4, 4, 8, 2], "bf16-grads": [2, 4, 2, 8, 2], "fp32": [4, 0, 4, 8, 4]};
  function recipe(name) {
    var r = RECIPES[name];
    return {name: name, weight_bytes: r[0], master_bytes: r[1], grad_bytes: r[2], moment_bytes: r[3],
      activation_bytes: r[4], optimizer_bytes: r[1] + r[3]};
  }

  function stateBytes(params, r, mode, d, gathered, unsharded) {
    gathered = gathered || 0; unsharded = unsharded || 0;
    if (mode === "none" || (d === 1 && mode !== "fsdp"))
      return {parameters: params * r.weight_bytes, gradients: params * r.grad_bytes, optimizer: params * r.optimizer_bytes};
    if (mode === "zero1")
      return {parameters: params * r.weight_bytes, gradients: params * r.grad_bytes, optimizer: params * r.optimizer_bytes / d};
    if (mode === "zero2")
      return {parameters: params * r.weight_bytes, gradients: params * r.grad_bytes / d, optimizer: params * r.optimizer_bytes / d};
    var shard = Math.max(r.master_bytes, r.weight_bytes);
    return {parameters: params * shard / d + gathered * r.weight_bytes,
      gradients: params * r.grad_bytes / d + unsharded * r.grad_bytes, optimizer: params * r.moment_bytes / d};
  }
  function total3(s) { return s.parameters + s.gradients + s.optimizer; }

  function fsdpGathered(blockParams, rootParams, blocks, pipelined, reshardAfterForward) {
    var total = blocks * blockParams + rootParams;
    if (pipelined || !reshardAfterForward) return [total, pipelined ? total : blockParams + rootParams];
    return [rootParams + Math.min(blocks, 2) * blockParams, blockParams + rootParams];
  }

  // port of reshards_after_forward: torchtitan's fsdp_reshard_after_forward policy
  function reshardsAfterForward(policy, pipelined) {
    if (policy === "always") return true;
    if (policy === "never") return false;
    return !pipelined;
  }

  // ports of stage_buffer_bytes and held_io_bytes: what torch's PipelineStage keeps beyond autograd
  function stageBufferBytes(boundary, m, first, last, stageIo) {
    if (stageIo === "freed") return 0;
    return m * boundary * ((first ? 0 : 1) + (last ? 0 : 1));
  }
  function heldIoBytes(boundary, first, last, stageIo) {
    if (stageIo === "freed") return 0;
    return (last ? 0 : boundary) - (first ? 0 : boundary);
  }

  // --- fsdp_window.py: the all-gathers of one rank in one step, torch's unshard window included -----------------------
  var MAX_ACTIVE_STAGES = 3;
  function withUnshardWindow(actions) {
    var active = [], out = [];
    actions.forEach(function (a, i) {
      var upcoming = [];
      for (var j = i; j < actions.length && upcoming.length < MAX_ACTIVE_STAGES; j++)
        if (upcoming.indexOf(actions[j][0]) < 0) upcoming.push(actions[j][0]);
      active.filter(function (s) { return upcoming.indexOf(s) < 0; }).forEach(function (s) {
        active.splice(active.indexOf(s), 1); out.push([s, "RESHARD"]);
      });
      upcoming.forEach(function (s) { if (active.indexOf(s) < 0) { active.push(s); out.push([s, "UNSHARD"]); } });
      out.push(a);
    });
    active.forEach(function (s) { out.push([s, "RESHARD"]); });
    return out;
  }
  // port of fsdp_step's gathered bytes: stages maps a stage to {blocks: [sizes], root: size}
  function fsdpGatheredBytes(actions, stages, reshardAfterForward, window) {
    var lowered = window ? withUnshardWindow(actions) : actions, gathered = {}, nbytes = 0;
    lowered.forEach(function (a) {
      var st = a[0], kind = a[1], g = stages[st], keys = [], b;
      for (b = 0; b < g.blocks.length; b++) keys.push([b, g.blocks[b]]);
      if (g.root) keys.push([-1, g.root]);
      if (kind === "RESHARD") { keys.forEach(function (k) { delete gathered[st + "|" + k[0]]; }); return; }
      keys.forEach(function (k) {
        if (!gathered[st + "|" + k[0]]) { nbytes += k[1]; gathered[st + "|" + k[0]] = true; }
      });
      if (kind === "F" && reshardAfterForward)
        keys.forEach(function (k) { if (k[0] !== -1) delete gathered[st + "|" + k[0]]; });
    });
    return nbytes;
  }

  function attentionWidths(s) {
    if (isMla(s)) {
      var qk = s.heads * (s.qk_nope_dim + s.qk_rope_dim);
      return [qk, qk, s.heads * s.v_head_dim, s.heads * s.v_head_dim];
    }
    return [s.heads * hd(s), s.kv_heads * hd(s), s.kv_heads * hd(s), s.heads * hd(s)];
  }

  function mlpValues(s, width, kernels) {
    if (gated(s)) return kernels === "book" ? 4 * width : 3 * width;
    return 2 * width;
  }

  // port of memory.layer_activation_values: [values in the activation dtype, float32 values] per token
  function layerActivationValues(s, kernels, recompute, moeLayer, seqLen) {
    var h = s.hidden, w = attentionWidths(s), q = w[0], k = w[1], v = w[2], out = w[3];
    var width = moeLayer ? s.expert_ffn : s.ffn;
    var routed = moeLayer ? s.top_k + s.shared_experts : 1;
    var router = moeLayer ? s.experts : 0, dispatched = moeLayer ? 2 * s.top_k * h : 0, lse = s.heads;  // dispatched tokens and expert outputs
    if (recompute === "full") return [h, 0];
    if (recompute === "selective") {
      if (gated(s)) return [h + q + v + out + routed * width + h + router + dispatched, lse];
      return [h + q + k + v + out + routed * width + router + dispatched, lse];
    }
    var stats = s.norm === "rms" ? 2 : 4;
    var mlp = routed * mlpValues(s, width, kernels) + router + dispatched;
    if (kernels === "book") return [11 * h + mlp + 2, lse];
    var fused = 4 * h + q + k + v + out + mlp;
    if (kernels === "unfused") return [fused + 2.5 * s.heads * seqLen + h, stats];
    return [fused, stats + lse];
  }

  function valuesBytes(vals, tokens, dt) { return tokens * (vals[0] * dt + vals[1] * Math.max(4, dt)); }

  function layerActivationBytes(s, tokens, dt, kernels, recompute, moeLayer, seqLen) {
    return valuesBytes(layerActivationValues(s, kernels, recompute, moeLayer, seqLen), tokens, dt);
  }

  function replicatedValues(s, kernels, recompute) {
    if (recompute === "full") return s.hidden;
    if (recompute === "selective") return 2 * s.hidden;
    return 4 * s.hidden + (kernels === "unfused" ? s.hidden : 0);
  }

  function recomputeTransientBytes(s, tokens, dt, kernels, recompute, seqLen) {
    if (recompute === "none") return 0;
    var moe = isMoe(s) && s.dense_layers < s.layers;
    return layerActivationBytes(s, tokens, dt, kernels, "none", moe, seqLen) -
      layerActivationBytes(s, tokens, dt, kernels, recompute, moe, seqLen);
  }

  function logitsBytes(s, tokens, dt, lossDt) { return tokens * s.vocab * (dt + (lossDt === undefined ? 4 : lossDt)); }
  function lossBackwardBytes(s, tokens) { return 2 * tokens * s.vocab * 4; }

  function countMoe(s, layers) {
    var n = 0;
    layers.forEach(function (i) { if (isMoe(s) && i >= s.dense_layers) n += 1; });
    return n;
  }

  function stageActivationBytes(s, layers, tokens, first, last, dt, kernels, recompute, seqLen) {
    var moe = countMoe(s, layers);
    var total = (layers.length - moe) * layerActivationBytes(s, tokens, dt, kernels, recompute, false, seqLen);
    if (moe) total += moe * layerActivationBytes(s, tokens, dt, kernels, recompute, true, seqLen);
    if (first) total += tokens * 8;
    if (last) {
      // fused: the norm's input and rstd, and its output, which the head keeps as its input
      var norm = kernels === "book" ? [3 * s.hidden + 1, 0] : [2 * s.hidden, s.norm === "rms" ? 1 : 2];
      total += valuesBytes(norm, tokens, dt);
    }
    return total;
  }

  function blockResidualValues(s) { return [6 * s.hidden + 2, s.heads]; }

  // port of memory.expert_activation_extra: an MoE layer's values per token on the busiest GPU beyond the count
  function expertActivationExtra(s, kernels, recompute, etp, load) {
    if (recompute === "full") return 0;
    var dispatched = 2 * s.top_k * s.hidden, width = s.expert_ffn;
    var routed = s.top_k * (recompute === "selective" ? width : mlpValues(s, width, kernels));
    return routed * (load - 1) + dispatched * (etp * load - 1);
  }

  function stageParameters(s, layers, first, last) {
    var moe = countMoe(s, layers);
    var blocks = (layers.length - moe) * layerParameters(s, 0) + (moe ? moe * layerParameters(s, s.layers - 1) : 0);
    return blocks + (first ? embeddingParameters(s) : 0) + (last ? headParameters(s) : 0);
  }

  // --- costs.py -------------------------------------------------------------------------------------------------------
  var DATA = {measured: {keys: [], rows: []}, efficiency: {}, efficiency_range: [0.2, 0.85], attention_backward: 2.5,
    presets: {}};

  function layerFlops(s, tokens, seqLen, moeLayer) {
    var w = attentionWidths(s), q = w[0], out = w[3];  // the query heads' widths: scores (d_qk) and values (d_v)
    var mm = attentionParameters(s);
    if (moeLayer) mm += (s.top_k + s.shared_experts) * mlpParameters(s, s.expert_ffn) + s.hidden * s.experts;
    else mm += mlpParameters(s, s.ffn);
    var products = 2.0 * tokens * mm, attention = tokens * seqLen * (q + out);
    return {F: products + attention, I: products + DATA.attention_backward * attention, W: products};
  }

  function headFlops(s, tokens) {
    var products = 2.0 * tokens * s.hidden * s.vocab;
    return {F: products, I: products, W: products};
  }

  // port of costs.efficiency: DATA.efficiency[kind] = [a, b, c, flops0, tokens_lo, tokens_hi]
  function efficiency(kind, hidden, tokens, flops) {
    var e = DATA.efficiency[kind], lo = DATA.efficiency_range[0], hi = DATA.efficiency_range[1];
    var n = Math.min(e[5], Math.max(e[4], tokens));
    var line = Math.min(hi, Math.max(lo, e[0] + e[1] * Math.log2(hidden / 4096) + e[2] * Math.log2(n / 8192)));
    return line * flops / (flops + e[3]);
  }

  function sameBlock(a, b) {
    return ["hidden", "heads", "kv_heads", "ffn", "mlp", "norm", "experts", "kv_lora_rank"].every(function (k) { return a[k] === b[k]; });
  }

  // port of costs.measured_rows: the exported rows (DATA.measured: their keys once, then each row's values) as objects
  var measuredFrom = null, measuredObjects = [];
  function measuredRows() {
    if (measuredFrom !== DATA.measured) {
      var keys = DATA.measured.keys;
      measuredObjects = DATA.measured.rows.map(function (row) {
        var r = {};
        keys.forEach(function (k, i) { r[k] = row[i]; });
        return r;
      });
      measuredFrom = DATA.measured;
    }
    return measuredObjects;
  }

  function measuredOn(gpuName) {
    return measuredRows().some(function (r) { return r.gpu === gpuName; });
  }

  function measured(s, part, seqLen, b, gpuName) {
    var rows = measuredRows();
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i], preset = DATA.presets[r.model];
      if (r.gpu === gpuName && preset && sameBlock(preset, s) && r.part === part && r.seq_len === seqLen &&
          r.microbatch === b && (part === "block" || preset.vocab === s.vocab))
        return {F: r.F_ms / 1e3, I: r.I_ms / 1e3, W: r.W_ms_est / 1e3, measured: true};
    }
    return null;
  }

  function estimate(f, prefix, hidden, tokens, gpu) {
    var peak = gpu.bf16_tflops * 1e12;
    return {F: f.F / (peak * efficiency(prefix + "F", hidden, tokens, f.F)),
      I: f.I / (peak * efficiency(prefix + "I", hidden, tokens, f.I)),
      W: f.W / (peak * efficiency(prefix + "W", hidden, tokens, f.W)), measured: false};
  }

  function layerCosts(s, gpu, b, seqLen, moeLayer, measuredOk) {
    if (measuredOk && measuredOn(gpu.name) && !moeLayer) {
      var hit = measured(s, "block", seqLen, b, gpu.name);
      if (hit) return hit;
    }
    return estimate(layerFlops(s, b * seqLen, seqLen, moeLayer), "", s.hidden, b * seqLen, gpu);
  }

  function headCosts(s, gpu, b, seqLen, measuredOk) {
    if (measuredOk && measuredOn(gpu.name)) {
      var hit = measured(s, "head+loss", seqLen, b, gpu.name);
      if (hit) return hit;
    }
    return estimate(headFlops(s, b * seqLen), "head_", s.hidden, b * seqLen, gpu);
  }

  // port of costs.moe_dense_costs: one GPU's share (of split) of an MoE layer's attention, router and shared experts
  function moeDenseCosts(s, gpu, b, seqLen, split) {
    var tokens = b * seqLen, w = attentionWidths(s), q = w[0], out = w[3];
    var products = 2.0 * tokens * (attentionParameters(s) + s.shared_experts * mlpParameters(s, s.expert_ffn)) +
      2.0 * tokens * s.hidden * s.experts;
    var attention = tokens * seqLen * (q + out);
    var f = {F: products + attention, I: products + DATA.attention_backward * attention, W: products};
    return estimate({F: f.F / split, I: f.I / split, W: f.W / split}, "", s.hidden, tokens, gpu);
  }

  // port of costs.expert_rows_factor: DATA.expert_gemm_tflops = [[rows, TFLOPS of shape 1, of shape 2], ...]
  function expertRowsFactor(rows) {
    var tab = DATA.expert_gemm_tflops, big = tab[tab.length - 1];
    var pts = tab.map(function (r) { return [Math.log2(r[0]), (r[1] / big[1] + r[2] / big[2]) / 2]; });
    var x = Math.log2(Math.max(rows, tab[0][0]));
    if (x >= pts[pts.length - 1][0]) return 1;
    for (var i = 0; i + 1 < pts.length; i++)
      if (x <= pts[i + 1][0]) return pts[i][1] + (pts[i + 1][1] - pts[i][1]) * (x - pts[i][0]) / (pts[i + 1][0] - pts[i][0]);
    return 1;
  }

  // port of costs.expert_costs: one GPU's routed experts, `copies` token copies, `perExpert` to each
  function expertCosts(s, gpu, copies, perExpert, etp) {
    var products = 2.0 * copies * mlpParameters(s, s.expert_ffn) / etp, rows = expertRowsFactor(perExpert);
    var c = estimate({F: products, I: products, W: products}, "", s.hidden, perExpert, gpu);
    return {F: c.F / rows, I: c.I / rows, W: c.W / rows, measured: false};
  }

  // --- search.py ------------------------------------------------------------------------------------------------------
  // Python's round(): half to even
  function pyRound(x) {
    var f = Math.floor(x), diff = x - f;
    if (diff > 0.5) return f + 1;
    if (diff < 0.5) return f;
    return f % 2 === 0 ? f : f + 1;
  }

  function numStages(L) { return L.p * (L.schedule === NO_PIPELINE ? 1 : stagesPerRank(L.schedule, L.v)); }

  function label(L) {
    var pipe = L.schedule === NO_PIPELINE ? "no pipeline" : L.schedule + " p=" + L.p + (L.v > 1 ? " v=" + L.v : "");
    var ends = L.balance === "ends" && L.p > 1 ? " ends" : "";
    var ep = ((L.ep || 1) > 1 ? " ep=" + L.ep : "") + ((L.etp || 1) > 1 ? " etp=" + L.etp : "");
    var cp = (L.cp || 1) > 1 ? " cp=" + L.cp : "";
    return "tp=" + L.tp + cp + " " + pipe + ends + " dp=" + L.dp + ep + " " + L.sharding + " b=" + L.b + " m=" + L.m +
      " recompute=" + L.recompute;
  }

  function layout(tp, p, dp, schedule, v, b, m, sharding, recompute, balance, ep, cp, etp) {
    return {tp: tp, p: p, dp: dp, schedule: schedule, v: v, b: b, m: m, sharding: sharding, recompute: recompute,
      balance: balance || "even", ep: ep || 1, cp: cp || 1, etp: etp || 1};
  }

  function usableBytes(req) { return req.gpu.memory_gb * GB * (1 - req.headroom); }

  function Planner(req) {
    // req: {model, gpu, gpus, gpus_per_node, global_batch, seq_len, intra, inter, recipe, kernels,
    //       sequence_parallel, headroom, tps, max_p, max_v, max_microbatch_size, microbatch_sizes,
    //       schedules, shardings, recomputes, balances, measured_costs}
    // the defaults of search.Request, exported from Python (explorer.planner_data)
    var defaults = DATA.request_defaults;
    for (var k in defaults) if (req[k] === undefined) req[k] = Array.isArray(defaults[k]) ? defaults[k].slice() : defaults[k];
    this.req = req;
    this.cache = {};
  }

  Planner.prototype.cached = function (name, key, fn) {
    var c = this.cache[name] || (this.cache[name] = {});
    if (!(key in c)) c[key] = fn();
    return c[key];
  };

  Planner.prototype.endWeights = function () {
    var self = this;
    return this.cached("ends", "", function () {
      var s = self.req.model, perLayer = layerParameters(s, s.layers - 1);
      var first = pyRound(embeddingParameters(s) / perLayer);
      var head = headCosts(s, self.req.gpu, 1, self.req.seq_len, self.req.measured_costs);
      var layer = layerCosts(s, self.req.gpu, 1, self.req.seq_len, isMoe(s), self.req.measured_costs);
      var last = pyRound((head.F + (head.I + head.W)) / (layer.F + (layer.I + layer.W)));
      return [first, last];
    });
  };

  function stageLayers(nLayers, nStages, firstLess, lastLess) {
    var out, i;
    if (nStages === 1) { out = []; for (i = 0; i < nLayers; i++) out.push(i); return [out]; }
    var units = nLayers + firstLess + lastLess;
    var sizes = assignLayers(units, nStages).map(function (x) { return x.length; });
    sizes[0] = Math.max(1, sizes[0] - firstLess);
    sizes[nStages - 1] = Math.max(1, sizes[nStages - 1] - lastLess);
    var sum = sizes.reduce(function (a, b) { return a + b; }, 0), missing = nLayers - sum, idx = 1;
    while (missing > 0 && nStages > 2) {
      sizes[idx] += 1; missing -= 1;
      idx = idx + 1 < nStages - 1 ? idx + 1 : 1;
    }
    if (missing) sizes[0] += missing;
    sum = sizes.reduce(function (a, b) { return a + b; }, 0);
    if (sum !== nLayers || Math.min.apply(null, sizes) < 1) return assignLayers(nLayers, nStages);
    out = []; var start = 0;
    sizes.forEach(function (n) { var r = []; for (var j = start; j < start + n; j++) r.push(j); out.push(r); start += n; });
    return out;
  }

  Planner.prototype.layersOf = function (nStagesValue, balance) {
    var self = this;
    return this.cached("layers", nStagesValue + "|" + balance, function () {
      var fl = balance === "ends" ? self.endWeights() : [0, 0];
      return stageLayers(self.req.model.layers, nStagesValue, fl[0], fl[1]);
    });
  };

  // port of pipeline_sizes, one size at a time
  function pipelineSize(req, ranks, p) {
    return ranks % p === 0 && p <= Math.min(req.model.layers, req.max_p) && (!req.pps.length || req.pps.indexOf(p) >= 0);
  }

  Planner.prototype.tensorParallelSizes = function () {
    var req = this.req, s = req.model, opts = req.tps.length ? req.tps : [];
    if (!opts.length) for (var k = 0; k < 8; k++) if (Math.pow(2, k) <= req.gpus_per_node) opts.push(Math.pow(2, k));
    return opts.filter(function (t) {
      return req.gpus % t === 0 && t <= req.gpus_per_node && s.heads % t === 0 && (isMla(s) || s.kv_heads % t === 0) && s.ffn % t === 0;
    });
  };

  // port of expert_parallel_sizes: those dividing the experts whose ep x etp divides tp x cp x dp
  Planner.prototype.expertParallelSizes = function (dp, tp, cp, etp) {
    var s = this.req.model, opts = this.req.eps.length ? this.req.eps : [], ranks = (tp || 1) * (cp || 1) * dp;
    etp = etp || 1;
    if (!isMoe(s)) return [1];
    if (!opts.length) for (var e = 1; e <= Math.floor(ranks / etp); e++) opts.push(e);
    return opts.filter(function (e) { return s.experts % e === 0 && ranks % (e * etp) === 0; });
  };

  // port of expert_layouts: the [ep, etp] Megatron-Core's MoE parallel folding lays over tp x cp x dp
  Planner.prototype.expertLayouts = function (tp, cp, dp) {
    var self = this, req = this.req, s = req.model, out = [];
    if (!isMoe(s)) return [[1, 1]];
    var etps = req.etps.length ? req.etps : (tp === 1 ? [1] : [1, tp]);
    etps.filter(function (e) { return e <= req.gpus_per_node && s.expert_ffn % e === 0; }).forEach(function (etp) {
      self.expertParallelSizes(dp, tp, cp, etp).forEach(function (ep) { out.push([ep, etp]); });
    });
    return out;
  };

  // port of stages_per_rank_tried
  function stagesPerRankTried(req, kind) {
    var out = [];
    if (kind === "loop") {
      if (req.vs.length) return req.vs.filter(function (v) { return v >= 2; });
      for (var v = 2; v <= req.max_v; v++) out.push(v);
      return out;
    }
    var one = kind === "v" ? 2 : 1;
    return !req.vs.length || req.vs.indexOf(one) >= 0 ? [one] : [];
  }

  Planner.prototype.candidates = function () {
    var self = this, req = this.req, out = [], tps = this.tensorParallelSizes();
    var bs = req.microbatch_sizes.length ? req.microbatch_sizes : [1, 2, 4, 8, 16, 32].filter(function (x) { return x <= req.max_microbatch_size; });
    tps.forEach(function (tp) { self.contextParallelSizes(tp).forEach(function (cp) {
      var ranks = req.gpus / (tp * cp);
      for (var p = 1; p <= ranks; p++) {
        if (!pipelineSize(req, ranks, p)) continue;
        var dp = ranks / p;
        if (req.dps.length && req.dps.indexOf(dp) < 0) continue;
        self.expertLayouts(tp, cp, dp).forEach(function (pair) {
          var ep = pair[0], etp = pair[1];
          bs.forEach(function (b) {
            if (req.global_batch % (dp * b)) return;
            var m = req.global_batch / (dp * b);
            var names = p === 1 ? [NO_PIPELINE] : req.schedules;
            names.forEach(function (name) {
              var kind = name === NO_PIPELINE ? "single" : placement(name);
              stagesPerRankTried(req, kind).forEach(function (v) {
                (dp > 1 ? req.shardings : ["none"]).forEach(function (sharding) {
                  req.recomputes.forEach(function (recompute) {
                    (p > 1 ? req.balances : ["even"]).forEach(function (balance) {
                      out.push(layout(tp, p, dp, name, v, b, m, sharding, recompute, balance, ep, cp, etp));
                    });
                  });
                });
              });
            });
          });
        });
      }
    }); });
    return out;
  };

  // port of context_parallel_sizes: 1 unless cps pins some, those whose tp x cp divides the GPUs
  Planner.prototype.contextParallelSizes = function (tp) {
    var req = this.req;
    return (req.cps.length ? req.cps : [1]).filter(function (c) { return req.gpus % (tp * c) === 0; });
  };

  // port of memory.kernels_problem
  function kernelsProblem(s, kernels) {
    if (KERNELS.indexOf(kernels) < 0) return "unknown kernels '" + kernels + "'; use one of " + KERNELS.join(", ");
    if (kernels === "book" && (s.mlp !== "swiglu" || s.norm !== "rms" || isMla(s)))
      return s.name + ": kernels 'book' counts the book's own Llama block, tensor by tensor, and this model's " +
        "blocks are not Llama-style; use kernels 'fused' or 'unfused'";
    return null;
  }

  // port of request_problem: why no layout of the request can be planned, or null
  Planner.prototype.requestProblem = function () {
    return kernelsProblem(this.req.model, this.req.kernels) || this.divisibilityProblem();
  };

  // port of divisibility_problem: why no layout divides the global batch, or null
  Planner.prototype.divisibilityProblem = function () {
    var req = this.req, tps = this.tensorParallelSizes(), dps = {};
    if (!tps.length)
      return "no tensor-parallel size divides both the " + req.gpus + " GPUs and the model's " + req.model.heads +
        " heads / " + req.model.kv_heads + " key/value heads / MLP width " + req.model.ffn + "; use another number of GPUs";
    var self = this;
    tps.forEach(function (tp) {
      self.contextParallelSizes(tp).forEach(function (cp) {
        var ranks = Math.floor(req.gpus / (tp * cp));
        for (var p = 1; p <= ranks; p++) if (pipelineSize(req, ranks, p)) dps[ranks / p] = true;
      });
    });
    if (!tps.some(function (tp) { return self.contextParallelSizes(tp).length; }))
      return "no context-parallel size of [" + req.cps.join(", ") + "] times a tensor-parallel size divides the " +
        req.gpus + " GPUs; use other --cp sizes";
    var list = Object.keys(dps).map(Number).sort(function (a, b) { return a - b; });
    if (!list.length)
      return "no pipeline size of [" + req.pps.join(", ") + "] divides the GPUs per tensor-parallel slot and is at most " +
        "the model's " + req.model.layers + " layers (and max_p " + req.max_p + "); try other pipeline sizes";
    if (list.some(function (dp) { return req.global_batch % dp === 0; })) return null;
    var smallest = list[0];
    return "--global-batch " + req.global_batch + " is not a multiple of any data-parallel size these GPUs allow (" +
      list.join(", ") + "); use a multiple of " + smallest + ", e.g. " + Math.ceil(req.global_batch / smallest) * smallest +
      ", or split each sequence over GPUs with context parallelism (--cp 2 halves the data-parallel sizes)";
  };

  // port of constraint_problem
  Planner.prototype.constraintProblem = function (L) {
    var cp = L.cp || 1;
    if (cp > 1 && this.req.seq_len % (2 * cp))
      return "context parallelism of " + cp + " cuts each sequence into " + 2 * cp + " chunks (two per GPU, " +
        "balancing causal attention), and " + this.req.seq_len + " tokens do not split so; use a sequence length that " +
        "is a multiple of " + 2 * cp + ", or another cp";
    if (L.schedule === NO_PIPELINE) return null;
    if (L.recompute === "selective" && this.torchSplitBackward(L))
      return "selective checkpointing cannot run under Schedule" + L.schedule + ": torch 2.13's weight-gradient " +
        "pass runs a second backward through each block, which selective checkpointing refuses ('Trying to " +
        "backward an extra time', chapter 12); use recompute none or full, or a schedule without the I/W split";
    return plannerWords(scheduleProblem(L.schedule, L.p, L.m, L.v, this.req.model.layers));
  };

  // port of search.PLANNER_WORDS and planner_words
  var PLANNER_WORDS = [[/got --stages-per-rank (\d+); use 2 or more, or Schedule1F1B/, "got v=$1; use v=2 or more, or 1F1B"],
    [/but --layers is (\d+); raise --layers to \d+ or more/, "but the model has $1 layers; use a smaller pp or v"],
    [/got --microbatches (\d+); use (\d+) or more/, "got m=$1; use m=$2 or more"],
    [/--microbatches (\d+) must be a multiple of (\d+); try (\d+) or (\d+)/, "m=$1 must be a multiple of $2; try m=$3 or m=$4"]];
  function plannerWords(problem) {
    if (problem === null) return null;
    PLANNER_WORDS.forEach(function (w) { problem = problem.replace(new RegExp(w[0].source, "g"), w[1]); });
    if (problem.indexOf("m=") >= 0) problem += " (m = global batch / (dp x b))";
    return problem;
  }

  // port of _torch_split_backward
  Planner.prototype.torchSplitBackward = function (L) {
    return SPLIT_BACKWARD.indexOf(L.schedule) >= 0 && this.req.stage_io === "torch";
  };

  Planner.prototype.order = function (name, p, m, v) {
    var self = this;
    return this.cached("order", name + "|" + p + "|" + m + "|" + v, function () {
      return name === NO_PIPELINE ? oneFOneBOrder(1, m) : order(name, p, m, v);
    });
  };

  Planner.prototype.compiled = function (name, p, m, v) {
    var self = this;
    return this.cached("compiled", name + "|" + p + "|" + m + "|" + v, function () { return compileOrder(self.order(name, p, m, v)); });
  };

  var SIMULATED_ACTIONS = 4000;

  // port of _simulated_ms
  function simulatedMs(L) {
    var perMicrobatch = numStages(L) * (SPLIT_BACKWARD.indexOf(L.schedule) >= 0 ? 3 : 2);
    if (L.schedule === NO_PIPELINE || L.m < 2 * L.p || L.m * perMicrobatch <= SIMULATED_ACTIONS) return [L.m];
    return [2 * L.p, 3 * L.p];
  }

  // port of _extrapolate
  function extrapolate(points, m, leastSlope) {
    if (points.length === 1) return points[0][1];
    var m1 = points[0][0], y1 = points[0][1], m2 = points[1][0], y2 = points[1][1], slope = (y2 - y1) / (m2 - m1);
    return y2 + (leastSlope === undefined ? slope : Math.max(slope, leastSlope)) * (m - m2);
  }

  Planner.prototype.inFlight = function (name, p, m, v) {
    var self = this;
    return this.cached("inflight", name + "|" + p + "|" + m + "|" + v, function () {
      var ord = self.order(name, p, m, v), out = [];
      Object.keys(ord).map(Number).sort(function (a, b) { return a - b; }).forEach(function (rank) {
        var set = {};
        ord[rank].forEach(function (a) { set[a.stage] = true; });
        var stages = Object.keys(set).map(Number).sort(function (a, b) { return a - b; });
        var local = {};
        stages.forEach(function (s, i) { local[s] = i; });
        var held = stages.map(function () { return 0; }), residual = held.slice();
        var total = 0, best = 0, bestHeld = held.slice(), bestResidual = residual.slice();
        ord[rank].forEach(function (a) {
          if (a.kind === "F") {
            held[local[a.stage]] += 1; total += 1;
            if (total >= best) { best = total; bestHeld = held.slice(); bestResidual = residual.slice(); }
          } else if (a.kind === "B" || a.kind === "W") {
            var i = local[a.stage];
            held[i] -= 1; total -= 1;
            if (a.kind === "W") residual[i] += 1;
          }
        });
        out.push(stages.map(function (s, i) { return [s, bestHeld[i], bestResidual[i]]; }));
      });
      return out;
    });
  };

  Planner.prototype.selectiveShare = function (moe) {
    var s = this.req.model, w = attentionWidths(s), k = w[1], out = w[3], h = s.hidden;
    var width = moe ? s.expert_ffn : s.ffn, routed = moe ? s.top_k + s.shared_experts : 1, redone;
    if (gated(s)) redone = h * k + out * h + routed * h * width;
    else redone = out * h + routed * width * h;
    var flops = layerFlops(s, 1, 1, moe).F;
    return Math.min(1.0, 2 * redone / flops);
  };

  // port of _stage_costs_cached: {stage|kind: seconds}, estimated
  var OVERLAPS_ALL_TO_ALL = ["DualPipeV"];

  // port of alltoall_seconds
  Planner.prototype.alltoallSeconds = function (nbytes, ep, tp) {
    var req = this.req;
    if (ep <= 1) return 0;
    if (ep * tp <= req.gpus_per_node) return linkAlltoall(req.intra, nbytes, ep);
    var local = Math.max(1, Math.floor(req.gpus_per_node / tp));
    var within = nbytes * (local - 1) / ep / req.intra.bandwidth;
    var across = nbytes * (ep - local) / ep / req.inter.bandwidth;
    return (ep - 1) * req.inter.latency + Math.max(within, across);
  };

  // port of expert_load: the busiest expert-parallel rank's tokens over the mean
  function expertLoad(req) {
    return req.capacity_factor > 0 ? Math.min(req.moe_imbalance, req.capacity_factor) : req.moe_imbalance;
  }

  // port of remote_nodes: other nodes a token's top_k experts are on, on average
  function remoteNodes(experts, topK, nodes) {
    if (nodes <= 1) return 0;
    var perNode = experts / nodes, miss = 1;
    for (var i = 0; i < topK; i++) miss *= Math.max(0, (experts - perNode - i) / (experts - i));
    return (nodes - 1) * (1 - miss);
  }

  // port of deepep_seconds: a token crosses once to each other node its experts are on
  Planner.prototype.deepepSeconds = function (nbytes, ep, stride) {
    var req = this.req, s = req.model;
    if (ep * stride <= req.gpus_per_node || ep <= 1) return this.alltoallSeconds(nbytes, ep, stride);
    var local = Math.max(1, Math.floor(req.gpus_per_node / stride)), nodes = Math.floor(ep / local);
    var within = nbytes * (local - 1) / ep / req.intra.bandwidth;
    var across = nbytes / s.top_k * remoteNodes(s.experts, s.top_k, nodes) / req.inter.bandwidth;
    return (nodes - 1) * req.inter.latency + (local - 1) * req.intra.latency + Math.max(within, across);
  };

  // port of moe_layer_seconds: one MoE layer on the busiest GPU, one microbatch
  Planner.prototype.moeLayerSeconds = function (tp, cp, b, ep, etp) {
    var self = this;
    return this.cached("moelayer", [tp, cp, b, ep, etp].join("|"), function () {
      var req = self.req, s = req.model, gpu = req.gpu, dt = recipe(req.recipe).activation_bytes, load = expertLoad(req);
      var dense = moeDenseCosts(s, gpu, b, req.seq_len, tp * cp);
      var own = b * req.seq_len / (tp * cp), copies = own * s.top_k * etp * load;
      var experts = expertCosts(s, gpu, copies, copies * ep / s.experts, etp);
      var sent = expertDispatchBytes(b, req.seq_len, s.hidden, s.top_k, dt, tp) / cp * load;
      var dispatch = 2 * (req.dispatcher === "deepep" ? self.deepepSeconds(sent, ep, etp) : self.alltoallSeconds(sent, ep, etp));
      if (etp > 1) dispatch += 2 * linkGather(etp <= req.gpus_per_node ? req.intra : req.inter, etp * sent, etp);
      var tpPart = 0;
      if (tp > 1) tpPart = linkAllreduce(req.intra, boundaryBytes(b, req.seq_len, s.hidden, dt) / cp, tp) * (s.shared_experts ? 2 : 1);
      return {compute_F: dense.F + experts.F, compute_I: dense.I + experts.I, compute_W: dense.W + experts.W,
        dispatch: dispatch, tp: tpPart};
    });
  };

  // port of _stage_costs: the per-microbatch seconds of each stage's F, I, W and B under layout L
  Planner.prototype.costsOf = function (L) {
    return this.stageCosts(L.tp, numStages(L), L.balance, L.b, L.recompute, L.ep || 1,
                           OVERLAPS_ALL_TO_ALL.indexOf(L.schedule) >= 0 && !!this.req.overlap_f_b, this.torchSplitBackward(L),
                           L.cp || 1, L.etp || 1);
  };

  // port of context_parallel_seconds: [forward, backward] seconds context parallelism adds to one layer and microbatch
  Planner.prototype.contextParallelSeconds = function (b, tp, cp, recompute) {
    var req = this.req;
    if (cp <= 1) return [0, 0];
    var w = attentionWidths(req.model), k = w[1], v = w[2];
    var nbytes = b * req.seq_len * (k + v) / tp * recipe(req.recipe).activation_bytes;
    var link = tp * cp <= req.gpus_per_node ? req.intra : req.inter;
    var gather = linkGather(link, nbytes, cp);
    // backward: K, V gathered again and dK, dV reduce-scattered; full recomputation's forward gathers once more
    return [gather, gather * (recompute === "full" ? 3 : 2)];
  };

  Planner.prototype.stageCosts = function (tp, nStagesValue, balance, b, recompute, ep, overlap, split, cp, etp) {
    var self = this;
    ep = ep || 1; overlap = !!overlap; split = !!split; cp = cp || 1; etp = etp || 1;
    return this.cached("stagecosts", [tp, nStagesValue, balance, b, recompute, ep, overlap, split, cp, etp].join("|"), function () {
      var req = self.req, s = req.model, layers = self.layersOf(nStagesValue, balance);
      var dense = layerCosts(s, req.gpu, b, req.seq_len, false, req.measured_costs);
      var head = headCosts(s, req.gpu, b, req.seq_len, req.measured_costs);
      var estimated = !(dense.measured && head.measured);
      var actBytes = recipe(req.recipe).activation_bytes, tpHalf = 0;
      if (tp > 1) tpHalf = 2 * linkAllreduce(req.intra, boundaryBytes(b, req.seq_len, s.hidden, actBytes) / cp, tp);
      var cpFB = self.contextParallelSeconds(b, tp, cp, recompute), cpF = cpFB[0], cpB = cpFB[1];
      var redo = {none: 0, full: dense.F, selective: dense.F * self.selectiveShare(false)};
      var out = {}, n = layers.length, perGroup = split && recompute === "full";
      // one layer's seconds per pass [F, I, W, W with recomputation per group], dense and MoE (moeLayerSeconds)
      var groups = blockWeightGroups(s, false), a2a = 0, perLayer = {};
      perLayer[false] = [(dense.F / (tp * cp) + tpHalf) + cpF, ((dense.I + redo[recompute]) / (tp * cp) + tpHalf) + cpB,
        (dense.W + 0) / (tp * cp), (dense.W + (perGroup ? groups * dense.F : 0)) / (tp * cp)];
      if (isMoe(s)) {
        var moe = self.moeLayerSeconds(tp, cp, b, ep, etp);
        a2a = moe.dispatch;
        var comm = moe.tp + a2a, groupsMoe = blockWeightGroups(s, true);
        var redoMoe = {none: 0, full: moe.compute_F + a2a, selective: moe.compute_F * self.selectiveShare(true)}[recompute];
        perLayer[true] = [moe.compute_F + comm + cpF, moe.compute_I + redoMoe + comm + cpB, moe.compute_W,
          moe.compute_W + (perGroup ? groupsMoe * moe.compute_F : 0)];
      }
      layers.forEach(function (owned, st) {
        var f = 0, i = 0, w = 0, nMoe = countMoe(s, owned);
        [[false, owned.length - nMoe], [true, nMoe]].forEach(function (pair) {
          var isM = pair[0], count = pair[1];
          if (count) {
            var c = perLayer[isM];
            f += count * c[0];
            i += count * c[1];
            w += count * (st > 0 ? c[3] : c[2]);
          }
        });
        if (st === n - 1) { f = f + head.F / (tp * cp); i = i + head.I / (tp * cp); w = w + head.W / (tp * cp); }
        out[st + "F"] = f; out[st + "I"] = i; out[st + "W"] = w; out[st + "B"] = i + w;
        if (overlap) { out[st + "F_a2a"] = nMoe * a2a; out[st + "B_a2a"] = nMoe * a2a; }
      });
      return {costs: out, estimated: estimated};
    });
  };

  Planner.prototype.owned = function (L, rank) {
    return L.schedule === NO_PIPELINE ? [0] : stageIndices(L.schedule, rank, L.p, L.v);
  };

  // port of stage_boundary_bytes
  Planner.prototype.stageBoundaryBytes = function (b, tp, cp) {
    var req = this.req, whole = boundaryBytes(b, req.seq_len, req.model.hidden, recipe(req.recipe).activation_bytes) / (cp || 1);
    return req.sequence_parallel ? whole / tp : whole;
  };

  Planner.prototype.tables = function (nStagesValue, balance, b, recompute, tp, cp, etp) {
    var self = this;
    cp = cp || 1; etp = etp || 1;
    return this.cached("tables", [nStagesValue, balance, b, recompute, tp, cp, etp].join("|"), function () {
      var req = self.req, s = req.model, layers = self.layersOf(nStagesValue, balance);
      var dt = recipe(req.recipe).activation_bytes, tokens = b * req.seq_len, n = layers.length;
      var whole = (req.sequence_parallel || tp === 1) ? 0 :
        replicatedValues(s, req.kernels, recompute) * tokens * dt * (1 - 1 / tp);
      var boundary = self.stageBoundaryBytes(b, tp, cp);
      var t = {per_mb: [], residual: [], params: [], block_params: [], blocks: [], experts: []};
      layers.forEach(function (owned, st) {
        t.per_mb.push(stageActivationBytes(s, owned, tokens, st === 0, st === n - 1, dt, req.kernels, recompute, req.seq_len) / (tp * cp) +
          owned.length * whole / cp + heldIoBytes(boundary, st === 0, st === n - 1, req.stage_io) +
          self.moeActivationBytes(owned, tokens, recompute, tp, cp, etp));
        t.residual.push(owned.length * valuesBytes(blockResidualValues(s), tokens, dt) / (tp * cp));
        t.params.push(stageParameters(s, owned, st === 0, st === n - 1) / tp);
        t.block_params.push(stageParameters(s, owned, false, false) / tp);
        t.blocks.push(owned.length);
        var e = 0;
        owned.forEach(function (i) { e += routedExpertParameters(s, i); });
        t.experts.push(e / tp);
      });
      return t;
    });
  };

  Planner.prototype.rankActivations = function (schedule, p, m, v, b, balance, recompute, tp, cp, etp) {
    var self = this;
    cp = cp || 1; etp = etp || 1;
    return this.cached("rankacts", [schedule, p, m, v, b, balance, recompute, tp, cp, etp].join("|"), function () {
      var req = self.req, s = req.model;
      var nS = p * (schedule === NO_PIPELINE ? 1 : stagesPerRank(schedule, v));
      var t = self.tables(nS, balance, b, recompute, tp, cp, etp);
      var dt = recipe(req.recipe).activation_bytes, tokens = b * req.seq_len;
      var split = SPLIT_BACKWARD.indexOf(schedule) >= 0;
      var logits = logitsBytes(s, tokens, dt) / (tp * cp), lossBwd = lossBackwardBytes(s, tokens) / (tp * cp);
      var transient = self.transient(b, recompute, tp, cp, etp);
      var ms = simulatedMs(layout(tp, p, 1, schedule, v, b, m, "none", recompute, balance));
      var peaks = ms.map(function (mm) { return self.inFlight(schedule, p, mm, v); });
      var out = [];
      for (var rank = 0; rank < p; rank++) {
        var actsPoints = [], logitPoints = [];
        ms.forEach(function (mm, k) {
          var acts = 0, last = 0;
          peaks[k][rank].forEach(function (e) {
            acts += e[1] * t.per_mb[e[0]] + (split && req.stage_io === "torch" ? e[2] * t.residual[e[0]] : 0);
            if (e[0] === nS - 1) last += e[1];
          });
          actsPoints.push([mm, acts]);
          logitPoints.push([mm, last * logits]);
        });
        var holdsLast = peaks[0][rank].some(function (e) { return e[0] === nS - 1; });
        out.push([extrapolate(actsPoints, m) + transient, extrapolate(logitPoints, m) + (holdsLast ? lossBwd : 0)]);
      }
      return out;
    });
  };

  // port of _moe_fp8_activation_bytes (bf16: the experts on the busiest GPU, gathered over etp)
  Planner.prototype.moeActivationBytes = function (owned, tokens, recompute, tp, cp, etp) {
    var req = this.req, s = req.model;
    if (!isMoe(s)) return 0;
    var nMoe = countMoe(s, owned);
    if (!nMoe) return 0;
    return nMoe * (tokens / (tp * cp)) * expertActivationExtra(s, req.kernels, recompute, etp, expertLoad(req)) *
      recipe(req.recipe).activation_bytes;
  };

  // port of expert_share and edp_size: the share of a stage's experts (over tp) a GPU holds, the experts' dp size
  function expertShare(L) { return L.tp / ((L.etp || 1) * (L.ep || 1)); }
  function edpSize(L) { return L.tp * (L.cp || 1) * L.dp / ((L.etp || 1) * (L.ep || 1)); }

  // port of _rank_state: {params (outside the routed experts), experts (this GPU's), state}
  Planner.prototype.rankState = function (L, t, stages) {
    var params = 0, experts = 0, blocks = 0, inBlocks = 0, share = expertShare(L), r = recipe(this.req.recipe);
    stages.forEach(function (s) { params += t.params[s]; });
    stages.forEach(function (s) { experts += t.experts[s]; });
    var dense = params - experts, local = experts * share, g = [0, 0];
    if (L.sharding === "fsdp") {
      var pipelined = L.p > 1;
      stages.forEach(function (s) { blocks += t.blocks[s]; });
      stages.forEach(function (s) { inBlocks += t.block_params[s]; });
      inBlocks = inBlocks - experts + local;
      g = fsdpGathered(inBlocks / blocks, dense + local - inBlocks, blocks, pipelined,
                       reshardsAfterForward(this.req.fsdp_reshard, pipelined));
      if (pipelined && stages.length > MAX_ACTIVE_STAGES) {
        var sizes = stages.map(function (s) { return fsdpShare(t, s, share); }).sort(function (a, b) { return b - a; });
        g[0] = 0;
        for (var k = 0; k < MAX_ACTIVE_STAGES; k++) g[0] += sizes[k];
      }
    }
    var dp = L.dp * (L.cp || 1);  // the state is sharded over dp x cp
    var state = stateBytes(dense, r, L.sharding, dp, g[0], g[1]);
    if (local) {
      var own = stateBytes(local, r, L.sharding, edpSize(L));
      state = {parameters: state.parameters + own.parameters, gradients: state.gradients + own.gradients,
        optimizer: state.optimizer + own.optimizer};
    }
    return {params: dense, experts: local, state: state};
  };

  function fsdpShare(t, s, share) { return t.params[s] - t.experts[s] + t.experts[s] * share; }

  // port of fsdp_gathers_factor: how many times over a pipeline rank all-gathers its parameters per step
  Planner.prototype.fsdpGathersFactor = function (L, t, rank) {
    var self = this, share = expertShare(L), stages = this.owned(L, rank), groups = {}, total = 0;
    var reshard = reshardsAfterForward(this.req.fsdp_reshard, true);
    stages.forEach(function (s) {
      var root = t.params[s] - t.block_params[s], inBlocks = fsdpShare(t, s, share) - root, blocks = [];
      for (var b = 0; b < t.blocks[s]; b++) blocks.push(inBlocks / t.blocks[s]);
      groups[s] = {blocks: blocks, root: root};
      total += fsdpShare(t, s, share);
    });
    var points = simulatedMs(L).map(function (mm) {
      var key = [L.schedule, L.p, mm, L.v, rank, reshard, JSON.stringify(groups)].join("|");
      return [mm, self.cached("fsdpgathers", key, function () {
        var actions = self.order(L.schedule, L.p, mm, L.v)[rank].map(function (a) { return [a.stage, a.kind]; });
        return fsdpGatheredBytes(actions, groups, reshard, placement(L.schedule) !== "single");
      })];
    });
    return extrapolate(points, L.m) / total;
  };

  // port of _transient: one layer's recomputation (its 1/cp share) and the keys and values context parallelism gathers
  Planner.prototype.transient = function (b, recompute, tp, cp, etp) {
    var req = this.req, dt = recipe(req.recipe).activation_bytes;
    var out = recomputeTransientBytes(req.model, b * req.seq_len, dt, req.kernels, recompute, req.seq_len) / (tp * cp);
    if (recompute !== "none" && isMoe(req.model)) {  // what the rebuilt layer keeps beyond it (bf16: the experts)
      var layer = [req.model.layers - 1];
      out += this.moeActivationBytes(layer, b * req.seq_len, "none", tp, cp, etp || 1) -
        this.moeActivationBytes(layer, b * req.seq_len, recompute, tp, cp, etp || 1);
    }
    if (cp > 1) {
      var w = attentionWidths(req.model);
      out += b * req.seq_len * (w[1] + w[2]) / tp * dt;
    }
    return out;
  };

  Planner.prototype.memoryFloor = function (L) {
    var t = this.tables(numStages(L), L.balance, L.b, L.recompute, L.tp, L.cp || 1, L.etp || 1), stages = this.owned(L, 0);
    var st = this.rankState(L, t, stages);
    var transient = this.transient(L.b, L.recompute, L.tp, L.cp || 1, L.etp || 1);
    var minAct = Math.min.apply(null, stages.map(function (s) { return t.per_mb[s]; }));
    return total3(st.state) + Math.min(L.m, L.p) * minAct + transient;
  };

  // port of rank_memory: per pipeline rank {rank, stages, parameters, gradients, optimizer, activations, logits, total}
  Planner.prototype.rankMemory = function (L) {
    var req = this.req, t = this.tables(numStages(L), L.balance, L.b, L.recompute, L.tp);
    var held = this.rankActivations(L.schedule, L.p, L.m, L.v, L.b, L.balance, L.recompute, L.tp, L.cp || 1, L.etp || 1), out = [];
    var boundary = this.stageBoundaryBytes(L.b, L.tp, L.cp || 1), n = numStages(L);
    for (var rank = 0; rank < L.p; rank++) {
      var stages = this.owned(L, rank), st = this.rankState(L, t, stages).state, buffers = 0;
      stages.forEach(function (s) { buffers += stageBufferBytes(boundary, L.m, s === 0, s === n - 1, req.stage_io); });
      var r = {rank: rank, stages: stages, parameters: st.parameters, gradients: st.gradients, optimizer: st.optimizer,
        activations: held[rank][0], logits: held[rank][1], buffers: buffers};
      r.total = r.parameters + r.gradients + r.optimizer + r.activations + r.logits + r.buffers;
      out.push(r);
    }
    return out;
  };

  Planner.prototype.dpExposed = function (L, params, busy, lastBackward, firstForward, experts, gathers) {
    var req = this.req;
    if (L.dp === 1) return [0, 0];
    var r = recipe(req.recipe), link = L.dp * L.tp <= req.gpus_per_node ? req.intra : req.inter;
    var groups = [[params, L.dp]];
    if (experts) groups.push([experts, edpSize(L)]);
    var allreduce = function (perParam) {
      var t = 0;
      groups.forEach(function (g) { t += linkAllreduce(link, g[0] * perParam, g[1]); });
      return t;
    };
    var gather = function (perParam) {
      var t = 0;
      groups.forEach(function (g) { t += linkGather(link, g[0] * perParam, g[1]); });
      return t;
    };
    if (L.sharding === "none") {
      var reduce = allreduce(r.grad_bytes);
      return [reduce, Math.max(0, reduce - lastBackward)];
    }
    if (L.sharding === "zero1" || L.sharding === "zero2") {
      var reduces = L.sharding === "zero2" && L.m > 1 ? L.m : 1;
      var rs = reduces * gather(r.grad_bytes), ag = gather(r.weight_bytes);
      if (reduces > 1) return [rs + ag, Math.max(0, rs - 2 * busy / 3) + Math.max(0, ag - firstForward)];
      return [rs + ag, Math.max(0, rs - lastBackward) + Math.max(0, ag - firstForward)];
    }
    if (L.p === 1) {
      var perMicrobatch = reshardsAfterForward(req.fsdp_reshard, false) ? 2 : 1;
      var total = L.m * (perMicrobatch * gather(r.weight_bytes) + gather(r.grad_bytes));
      return [total, Math.max(0, total - busy)];
    }
    var ag2 = (gathers === undefined ? 1 : gathers) * gather(r.weight_bytes), rs2 = gather(r.grad_bytes);
    return [ag2 + rs2, Math.max(0, ag2 - busy) + rs2];
  };

  Planner.prototype.modelFlopsPerToken = function () {
    var self = this;
    return this.cached("mflops", "", function () {
      var s = self.req.model, seq = self.req.seq_len, products = 0, attention = 0, i;
      for (i = 0; i < s.layers; i++) products += layerFlops(s, 1, seq, isMoe(s) && i >= s.dense_layers).W;
      products += 2 * s.hidden * s.vocab;
      for (i = 0; i < s.layers; i++) attention += layerFlops(s, 1, seq, false).F - layerFlops(s, 1, seq, false).W;
      return 3 * products + 3 * attention;
    });
  };

  function nodeOf(ppRank, dp, tp, gpusPerNode) { return Math.floor(ppRank * dp * tp / gpusPerNode); }

  // one simulated step of the pipeline: per rank end, busy, and the span; with events when asked
  Planner.prototype.pipelineRun = function (L, m, costs, withEvents) {
    var req = this.req, c = this.compiled(L.schedule, L.p, m, L.v);
    var boundary = boundaryBytes(L.b, req.seq_len, req.model.hidden, recipe(req.recipe).activation_bytes) / L.tp / (L.cp || 1);
    var hopIntra = linkTime(req.intra, boundary), hopInter = linkTime(req.inter, boundary);
    var nodes = [];
    for (var r = 0; r < L.p; r++) nodes.push(nodeOf(r, L.dp * (L.cp || 1), L.tp, req.gpus_per_node));
    var cost = this.actionCosts(L.schedule, L.p, m, L.v, c, costs);
    var hop = c.actions.map(function (a, i) {
      return c.remote[i] ? (nodes[c.ranks[c.dep[i]]] === nodes[c.ranks[i]] ? hopIntra : hopInter) : 0;
    });
    var se = run(c, cost, hop), ends = [], busy = [];
    for (r = 0; r < L.p; r++) { ends.push(0); busy.push(0); }
    for (var i = 0; i < c.actions.length; i++) {
      ends[c.ranks[i]] = Math.max(ends[c.ranks[i]], se[1][i]);
      busy[c.ranks[i]] += se[1][i] - se[0][i];
    }
    var out = {ends: ends, busy: busy, span: Math.max.apply(null, ends)};
    // with events: each action, and for a hand-off the index of the action on another rank it waits on
    if (withEvents) out.events = c.actions.map(function (a, i) {
      return {rank: c.ranks[i], stage: a.stage, kind: a.kind, microbatch: a.microbatch, start: se[0][i], end: se[1][i],
        from: c.remote[i] ? c.dep[i] : -1};
    });
    return out;
  };

  // port of _action_costs: each action's seconds, a DualPipeV pair's halves in pairSlots when overlapped
  Planner.prototype.actionCosts = function (name, p, m, v, c, costs) {
    var cost = c.actions.map(function (a) { return costs[a.stage + a.kind]; });
    if (!(("0F_a2a") in costs)) return cost;
    var paired = this.cached("overlapped", name + "|" + p + "|" + m + "|" + v, function () { return overlappedForwards(name, p, m); });
    c.actions.forEach(function (a, i) {
      if (paired[key3(a.stage, a.kind, a.microbatch)]) {
        var bwd = c.actions[i + 1], af = costs[a.stage + "F_a2a"], ab = costs[bwd.stage + "B_a2a"];
        var slots = pairSlots([cost[i] - af, af], [cost[i + 1] - ab, ab]);
        cost[i] = slots[0]; cost[i + 1] = slots[1];
      }
    });
    return cost;
  };

  // port of predict
  Planner.prototype.predict = function (L, checkMemory, mem) {
    var req = this.req, self = this;
    mem = mem || this.rankMemory(L);
    var pred = {layout: L, label: label(L), memory: mem, step_s: Infinity, pipeline_s: 0, dp_exposed_s: 0,
      optimizer_s: 0, bubble: 0, tokens_per_s_per_gpu: 0, mfu: 0, why_not: null, estimated: false};
    var worst = mem[0];
    mem.forEach(function (r) { if (r.total > worst.total) worst = r; });
    pred.peak_bytes = worst.total;
    if (checkMemory !== false && worst.total > usableBytes(req)) {
      var kinds = MEMORY_KINDS, big = kinds[0];
      kinds.forEach(function (k) { if (worst[k] > worst[big]) big = k; });
      pred.why_not = "does not fit: rank " + worst.rank + " needs " + (worst.total / GB).toFixed(1) + " GB of the " +
        (usableBytes(req) / GB).toFixed(1) + " GB usable, " + (worst[big] / GB).toFixed(1) + " GB of it " + big;
      return pred;
    }
    var sc = this.costsOf(L);
    pred.estimated = sc.estimated;
    var ms = simulatedMs(L), runs = ms.map(function (m) { return self.pipelineRun(L, m, sc.costs, false); });
    var end = [], busy = [], r, bottleneck = 0;
    for (r = 0; r < L.p; r++) busy.push(extrapolate(ms.map(function (m, k) { return [m, runs[k].busy[r]]; }), L.m));
    if (ms.length > 1) {
      bottleneck = -Infinity;
      for (r = 0; r < L.p; r++) bottleneck = Math.max(bottleneck, (runs[1].busy[r] - runs[0].busy[r]) / (ms[1] - ms[0]));
    }
    var span = extrapolate(ms.map(function (m, k) { return [m, runs[k].span]; }), L.m, bottleneck);
    for (r = 0; r < L.p; r++) end.push(extrapolate(ms.map(function (m, k) { return [m, runs[k].ends[r]]; }), L.m, bottleneck));
    var step = 0, exposedWorst = 0, trafficWorst = 0, critical = {};
    var t = this.tables(numStages(L), L.balance, L.b, L.recompute, L.tp);
    // gradients are reduced, and state sharded, over the dp x cp GPUs that hold the same parameters
    var replicas = Object.assign({}, L, {dp: L.dp * (L.cp || 1), cp: 1});
    for (r = 0; r < L.p; r++) {
      var stages = this.owned(L, r), rs = this.rankState(L, t, stages), lastBackward = 0;
      stages.forEach(function (s) { lastBackward += sc.costs[s + "B"]; });
      var firstForward = sc.costs[stages[0] + "F"];
      var gathers = L.sharding === "fsdp" && L.p > 1 ? this.fsdpGathersFactor(L, t, r) : 1;
      var te = this.dpExposed(replicas, rs.params, busy[r], lastBackward, firstForward, rs.experts, gathers);
      var opt = this.optimizerSeconds(rs.params, replicas, rs.experts);
      // the rank that finishes last sets the step: keep its parts
      if (end[r] + te[1] + opt > step) critical = {rank: r, end_s: end[r], busy_s: busy[r], dp_exposed_s: te[1], optimizer_s: opt};
      step = Math.max(step, end[r] + te[1] + opt);
      exposedWorst = Math.max(exposedWorst, te[1]); trafficWorst = Math.max(trafficWorst, te[0]);
      pred.optimizer_s = Math.max(pred.optimizer_s, opt);
    }
    pred.step_s = step; pred.pipeline_s = span; pred.dp_exposed_s = exposedWorst;
    var busySum = 0;
    busy.forEach(function (x) { busySum += x; });
    pred.bubble = span ? Math.max(0, 1 - busySum / (L.p * span)) : 0;
    pred.tokens_per_s_per_gpu = req.global_batch * req.seq_len / step / req.gpus;
    pred.mfu = pred.tokens_per_s_per_gpu * this.modelFlopsPerToken() / (req.gpu.bf16_tflops * 1e12);
    pred.dp_traffic_s = trafficWorst;
    pred.critical = critical;
    return pred;
  };

  Planner.prototype.optimizerSeconds = function (params, L, experts) {
    var r = recipe(this.req.recipe), sharded = L.sharding !== "none";
    experts = experts || 0;
    var share = (sharded ? params / L.dp : params) + (sharded ? experts / edpSize(L) : experts);
    return share * (r.grad_bytes + 2 * r.optimizer_bytes + r.weight_bytes) / (this.req.gpu.hbm_tb_s * 1e12);
  };

  Planner.prototype.busiest = function (L) {
    var self = this, key = [L.schedule, L.p, L.v, numStages(L), L.balance, L.b, L.recompute, L.tp, L.ep || 1,
                            L.cp || 1, L.etp || 1].join("|");
    return this.cached("busiest", key, function () {
      var sc = self.costsOf(L).costs;
      var split = SPLIT_BACKWARD.indexOf(L.schedule) >= 0, worst = -Infinity;
      for (var r = 0; r < L.p; r++) {
        var sum = 0;
        // a DualPipeV pair may hide its all-to-alls (pairSlots): the bound counts computation only there
        self.owned(L, r).forEach(function (s) {
          sum += sc[s + "F"] + (split ? sc[s + "I"] + sc[s + "W"] : sc[s + "B"]) - (sc[s + "F_a2a"] || 0) - (sc[s + "B_a2a"] || 0);
        });
        worst = Math.max(worst, sum);
      }
      return worst;
    });
  };

  Planner.prototype.lowerBound = function (L) { return L.m * this.busiest(L); };

  // port of plan: {ranked, dropped}
  Planner.prototype.plan = function (slack) {
    slack = slack === undefined ? DATA.slack : slack;
    var self = this, req = this.req, dropped = [], valid = [];
    this.candidates().forEach(function (L) {
      var problem = self.constraintProblem(L);
      if (problem) { dropped.push({layout: L, label: label(L), why_not: problem}); return; }
      valid.push([self.lowerBound(L), L]);
    });
    valid.sort(function (x, y) { return x[0] - y[0]; });
    var ranked = [], best = Infinity;
    for (var i = 0; i < valid.length; i++) {
      var bound = valid[i][0], L = valid[i][1];
      if (bound > best * (1 + slack)) break;
      var floor = this.memoryFloor(L);
      if (floor > usableBytes(req)) {
        dropped.push({layout: L, label: label(L), why_not: "does not fit: rank 0's state and the " + Math.min(L.m, L.p) +
          " microbatches every schedule holds there before its first backward need " + (floor / GB).toFixed(1) +
          " GB of the " + (usableBytes(req) / GB).toFixed(1) + " GB usable"});
        continue;
      }
      var mem = this.rankMemory(L), worst = 0;
      mem.forEach(function (r) { worst = Math.max(worst, r.total); });
      if (worst > usableBytes(req)) { dropped.push(this.predict(L, true, mem)); continue; }
      var pred = this.predict(L, false, mem);
      ranked.push(pred);
      best = Math.min(best, pred.step_s);
    }
    ranked.sort(function (x, y) { return x.step_s - y.step_s; });
    return {ranked: ranked, dropped: dropped};
  };

  // port of search.closest: of the dropped layouts, the one that needs the least memory, counted
  Planner.prototype.closest = function (dropped) {
    var self = this, counted = dropped.filter(function (o) { return o.memory; });
    if (!counted.length) {
      var unfit = dropped.filter(function (o) { return (o.why_not || "").indexOf("does not fit") === 0; });
      if (unfit.length) {
        var best = unfit[0].layout, bestFloor = this.memoryFloor(best);
        unfit.slice(1).forEach(function (o) {
          var f = self.memoryFloor(o.layout);
          if (f < bestFloor) { best = o.layout; bestFloor = f; }
        });
        counted = [this.predict(best, true)];
      }
    }
    var out = null;
    counted.forEach(function (o) { if (out === null || o.peak_bytes < out.peak_bytes) out = o; });
    return out;
  };

  // one step of a layout, simulated at its own m (for drawing; not extrapolated)
  Planner.prototype.timeline = function (L) {
    var sc = this.costsOf(L);
    return this.pipelineRun(L, L.m, sc.costs, true);
  };

  // --- plan.py's exports: a layout as a torchtitan 0.3.0 job or Megatron-LM arguments --------------------
  // (the frameworks' options, torchtitan's registry and Megatron's sharding flags come from plan.py, in DATA.export)

  // port of plan.runs_on
  Planner.prototype.runsOn = function (L, kind) {
    var fw = DATA.export.frameworks[kind], experts = expertsProblem(L, kind);
    if (experts) return experts;
    if (fw.schedules.indexOf(L.schedule) < 0) return kind + " runs no " + L.schedule + " schedule";
    if (fw.shardings.indexOf(L.sharding) < 0) return kind + " has no " + L.sharding + " sharding";
    if (kind === "torchtitan" && this.req.overlap_f_b && L.schedule === "DualPipeV" && (L.ep || 1) > 1)
      return "torchtitan 0.3.0 has no DualPipeV overlap of the experts' all-to-all (it registers no OVERLAP_F_B function; the overlap added after it refuses activation checkpointing): plan without --overlap-f-b";
    if (kind === "torchtitan" && (L.cp || 1) > 1 && L.sharding !== "fsdp")
      return "torchtitan shards the parameters over the context-parallel GPUs whenever cp > 1 (FSDP over " +
        "dp_shard x cp, ParallelDims.fsdp_enabled): use sharding fsdp";
    if (fw.recomputes.indexOf(L.recompute) < 0)
      return kind + "'s selective recomputation (core attention only, by default) keeps about twice the " +
        "activations of the op-level policy the planner counts";
    if (kind === "megatron") {
      if (this.req.model.position === "alibi") return "Megatron-LM has no ALiBi position embedding";
      if (!(this.req.model.mlp in DATA.export.megatron_mlp)) return "Megatron-LM's command line has no " + this.req.model.mlp + " MLP";
      var optimizer = this.req.optimizer || "adamw";
      if (!(optimizer in DATA.export.megatron_optimizer)) return "Megatron-LM has no " + optimizer + " optimizer";
    }
    if (kind === "megatron" && L.p > 1) {
      if (L.balance === "ends" && numStages(L) > L.p)
        return "Megatron-LM lightens the first and last pipeline ranks, not stages, under interleaving";
      var layers = this.layersOf(numStages(L), L.balance).map(function (x) { return x.length; });
      var middle = L.balance === "ends" ? layers.slice(1, -1) : layers;
      if (middle.some(function (n) { return n !== middle[0]; }))
        return "Megatron-LM splits the " + (L.balance === "ends" ? "middle " : "") + "layers evenly over the stages, and " +
          middle.reduce(function (a, b) { return a + b; }, 0) + " do not split over " + middle.length;
    }
    return null;
  };

  // port of plan.experts_problem: torchtitan 0.3.0 borrows ep from dp_shard x cp x tp and has no expert tensor parallelism
  function expertsProblem(L, kind) {
    var ep = L.ep || 1, etp = L.etp || 1, cp = L.cp || 1;
    if (kind !== "torchtitan" || (ep === 1 && etp === 1)) return null;
    if (ep > 1 && etp > 1) return "torchtitan 0.3.0 has no expert tensor parallelism beside expert parallelism (etp " + etp + "): use etp 1";
    if (ep === 1 && etp !== 1 && etp !== L.tp) return "torchtitan 0.3.0 splits the experts over all tp " + L.tp + " GPUs or none (etp " + etp + ")";
    var shard = L.sharding === "fsdp" ? L.dp : 1;
    if ((shard * cp * L.tp) % ep)
      return "torchtitan 0.3.0 borrows ep " + ep + " from dp_shard x cp x tp = " + shard * cp * L.tp +
        " (its replicated data parallelism stays outside): use sharding fsdp or a smaller ep";
    return null;
  }

  // port of plan.torchtitan_args
  Planner.prototype.torchtitanArgs = function (L) {
    var req = this.req, ex = DATA.export, fl = L.balance === "ends" && L.p > 1 ? this.endWeights() : [0, 0], notes = [];
    var args = ex.torchtitan_overrides.slice();
    args.push("--parallelism.data_parallel_replicate_degree " + (L.sharding === "none" ? L.dp : 1),
      "--parallelism.data_parallel_shard_degree " + (L.sharding === "fsdp" ? L.dp : 1),
      "--parallelism.fsdp_reshard_after_forward " + req.fsdp_reshard,
      "--parallelism.tensor_parallel_degree " + L.tp);
    if (L.tp > 1) args.push(req.sequence_parallel ? "--parallelism.enable_sequence_parallel"
                                                  : "--parallelism.no-enable_sequence_parallel");
    args.push("--parallelism.context_parallel_degree " + (L.cp || 1), "--parallelism.expert_parallel_degree " + (L.ep || 1),
              "--parallelism.pipeline_parallel_degree " + L.p);
    if (L.p > 1) {
      args.push("--parallelism.pipeline_parallel_schedule " + L.schedule,
                "--parallelism.pipeline_parallel_microbatch_size " + L.b,
                "--parallelism.pipeline_parallel_first_stage_less_layers " + fl[0],
                "--parallelism.pipeline_parallel_last_stage_less_layers " + fl[1]);
      var nS = numStages(L), defaultV = placement(L.schedule) === "single" ? 1 : 2;
      if (nS / L.p !== defaultV) {
        var units = req.model.layers + fl[0] + fl[1], perStage = Math.ceil(units / nS);
        args.push("--parallelism.pipeline_parallel_layers_per_stage " + perStage);
        if (Math.ceil(units / perStage) !== nS)
          notes.push("torchtitan cuts " + units + " layer units into " + Math.ceil(units / perStage) + " stages at " +
            perStage + " per stage, not " + nS + "; list the stages' modules in --parallelism.module_fqns_per_model_part");
      }
      args.push("--training.disable_cuda_graphs");
      if (L.schedule === "DualPipeV")
        notes.push("torchtitan 0.3.0 registers no function for DualPipeV's overlapped pairs: torch runs each " +
          "pair's forward and backward one after the other");
    }
    args.push("--training.local_batch_size " + (L.p > 1 ? L.b * L.m : L.b),
              "--training.global_batch_size " + req.global_batch, "--training.seq_len " + req.seq_len,
              "activation-checkpoint:" + L.recompute);
    var logits = 0;
    this.rankMemory(L).forEach(function (r) { logits = Math.max(logits, r.logits); });
    notes.push("kept from the registry entry: its optimizer (AdamW) and learning-rate schedule, checkpoints every " +
      ex.torchtitan_checkpoint_interval + " steps under <OUTPUT_DIR>/checkpoint, and its loss chunked along the sequence " +
      "(ChunkedLossWrapper, " + ex.torchtitan_loss_chunks + " chunks), which holds about 1/" + ex.torchtitan_loss_chunks +
      " of the logits the planner counts" + (logits ? " (" + (logits / GB).toFixed(1) + " GB on the GPU that holds the most)" : "") +
      ": the job needs less memory than printed (--loss.num_chunks 1 holds them whole, as counted)");
    if (req.recipe !== "bf16")
      notes.push("torchtitan's FSDP keeps float32 master weights and reduces gradients in float32 (the bf16 recipe); " +
        "the planner counted --recipe " + req.recipe);
    var precision = req.precision || "bf16", optimizer = req.optimizer || "adamw";
    if (precision in ex.torchtitan_precision_notes) notes.push(ex.torchtitan_precision_notes[precision]);
    if (optimizer !== "adamw")
      notes.push("the planner counted the state of " + optimizer + "; the registry entry runs AdamW: set yours in it");
    return [args, notes];
  };

  // port of plan.megatron_model_args: the model's shape as Megatron-LM's command line gives it
  Planner.prototype.megatronModelArgs = function () {
    var req = this.req, m = req.model, notes = [], mla = isMla(m);
    var args = ["--num-layers " + m.layers, "--hidden-size " + m.hidden, "--num-attention-heads " + m.heads];
    if (m.kv_heads !== m.heads && !mla) args.push("--group-query-attention", "--num-query-groups " + m.kv_heads);
    if (m.head_dim && m.head_dim !== Math.floor(m.hidden / m.heads) && !mla) args.push("--kv-channels " + m.head_dim);
    args.push("--ffn-hidden-size " + m.ffn);
    var positions = Math.max(req.seq_len, m.max_positions);
    args.push("--seq-length " + req.seq_len, "--max-position-embeddings " + positions);
    if (m.position === "learned" && positions !== m.max_positions)
      notes.push("Megatron-LM needs --max-position-embeddings of at least --seq-length: " + positions +
        " learned positions, where the model has " + m.max_positions);
    args = args.concat(DATA.export.megatron_mlp[m.mlp]);
    if (m.norm === "rms") args.push("--normalization RMSNorm");
    if (m.position === "rope") args.push("--position-embedding-type rope", "--rotary-base <ROPE_BASE>");
    else args.push("--position-embedding-type learned_absolute");
    if (!m.bias) {
      args.push("--disable-bias-linear");
      if (m.qkv_bias) args.push("--add-qkv-bias");
    }
    if (!m.tied) args.push("--untie-embeddings-and-output-weights");
    args.push("--attention-dropout 0.0", "--hidden-dropout 0.0");
    if (mla) {
      args.push("--multi-latent-attention", "--kv-lora-rank " + m.kv_lora_rank, "--qk-head-dim " + m.qk_nope_dim,
                "--qk-pos-emb-head-dim " + m.qk_rope_dim, "--v-head-dim " + m.v_head_dim);
      if (m.q_lora_rank) args.push("--q-lora-rank " + m.q_lora_rank);
    }
    if (isMoe(m)) {
      args.push("--num-experts " + m.experts, "--moe-router-topk " + m.top_k, "--moe-ffn-hidden-size " + m.expert_ffn);
      args = args.concat(DATA.export.megatron_dispatcher[req.dispatcher || "alltoall"]);
      args.push("--moe-grouped-gemm");
      if (req.capacity_factor > 0) args.push("--moe-expert-capacity-factor " + String(req.capacity_factor));  // Python's :g for such values
      if (m.shared_experts) args.push("--moe-shared-expert-intermediate-size " + m.shared_experts * m.expert_ffn);
      if (m.dense_layers) args.push("--moe-layer-freq '([0]*" + m.dense_layers + "+[1]*" + (m.layers - m.dense_layers) + ")'");
      if (m.router_bias) args.push("--moe-router-enable-expert-bias");
    }
    return [args, notes];
  };

  // port of plan.megatron_args
  Planner.prototype.megatronArgs = function (L) {
    var req = this.req, ex = DATA.export;
    var layers = this.layersOf(numStages(L), L.balance).map(function (x) { return x.length; });
    var out = this.megatronModelArgs(), args = out[0], notes = out[1];
    args.push("--tensor-model-parallel-size " + L.tp, "--pipeline-model-parallel-size " + L.p);
    if ((L.cp || 1) > 1) args.push("--context-parallel-size " + L.cp);
    if ((L.ep || 1) > 1) args.push("--expert-model-parallel-size " + L.ep);
    if (isMoe(req.model)) args.push("--expert-tensor-parallel-size " + (L.etp || 1));
    if (numStages(L) > L.p) args.push("--num-virtual-stages-per-pipeline-rank " + numStages(L) / L.p);
    if (L.balance === "ends" && L.p > 1)
      args.push("--decoder-first-pipeline-num-layers " + layers[0], "--decoder-last-pipeline-num-layers " + layers[layers.length - 1]);
    if (L.tp > 1 && req.sequence_parallel) args.push("--sequence-parallel");
    args = args.concat(ex.megatron_sharding[L.sharding]);
    if (L.dp * (L.cp || 1) > 1) args = args.concat(ex.megatron_overlap[L.sharding]);
    if (L.sharding === "zero2" || L.sharding === "fsdp")
      notes.push(L.sharding + ": Megatron-Core's Megatron-FSDP" +
        (L.p > 1 ? "; check that your version runs it with pipeline parallelism" : ""));
    if (L.recompute === "full") args.push("--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1");
    if (req.kernels === "unfused") args.push("--attention-backend unfused");
    args.push("--micro-batch-size " + L.b, "--global-batch-size " + req.global_batch, "--bf16");
    args = args.concat(ex.megatron_precision[req.precision || "bf16"], ex.megatron_optimizer[req.optimizer || "adamw"]);
    args.push("--train-iters <TRAIN_ITERS>", "--lr <LR>", "--lr-warmup-iters <WARMUP_ITERS>", "--eval-iters 0",
              "--data-path <DATA_PREFIX>", "--tokenizer-type HuggingFaceTokenizer", "--tokenizer-model <TOKENIZER>",
              "--save <CHECKPOINT_DIR>", "--load <CHECKPOINT_DIR>", "--save-interval <SAVE_INTERVAL>");
    var step = ex.megatron_vocab_divisor * L.tp, padded = Math.ceil(req.model.vocab / step) * step;
    if (padded !== req.model.vocab)
      notes.push("Megatron-LM pads the vocabulary to " + padded + " (a multiple of " + ex.megatron_vocab_divisor +
        " x tp), where the planner counts " + req.model.vocab);
    notes.push("the learning-rate schedule, Adam's betas, weight decay and clipping are Megatron-LM's defaults, " +
      "and evaluation is off (--eval-iters 0: the planner's time has none): set yours");
    return [args, notes];
  };

  // port of plan.export (throws, as the Python raises, where the framework cannot run the layout)
  Planner.prototype.exportText = function (L, kind) {
    var req = this.req, problem = this.runsOn(L, kind), out, notes, command;
    if (problem) throw new Error("--export " + kind + ": " + problem + " (" + label(L) + ")");
    var ex = DATA.export;
    var nodes = Math.ceil(req.gpus / req.gpus_per_node), perNode = Math.min(req.gpus, req.gpus_per_node);
    var torchrun = "torchrun --nnodes " + nodes + " --nproc-per-node " + perNode +
      (nodes > 1 ? " --rdzv-backend c10d --rdzv-endpoint <HEAD_NODE>:29500" : "");
    if (kind === "torchtitan") {
      out = this.torchtitanArgs(L); notes = out[1];
      var entry = ex.torchtitan_registry[req.model.name], module, config;
      if (!entry) {
        module = "<MODULE>"; config = "<CONFIG>";
        notes.unshift("torchtitan " + ex.torchtitan_version + " has no registry entry for " + req.model.name + ": write one (a " +
          "function returning Trainer.Config, as torchtitan/models/llama3/config_registry.py's llama3_70b) and name its " +
          "module and function below");
      } else {
        module = entry[0]; config = entry[1];
        notes.unshift("torchtitan " + ex.torchtitan_version + " (pip install torchtitan==" + ex.torchtitan_version +
          "; its main branch has renamed fields since): registry entry " + config + ", model flavour " + entry[2]);
        if (config in ex.torchtitan_entry_notes) notes.splice(1, 0, "the registry entry " + config + " " + ex.torchtitan_entry_notes[config]);
      }
      command = [torchrun + " -m torchtitan.train --module " + module + " --config " + config].concat(out[0]).join(" \\\n  ");
    } else {
      out = this.megatronArgs(L); notes = out[1];
      notes.unshift("Megatron-LM " + ex.megatron_lm_release + " (git clone --branch " + ex.megatron_lm_release +
        " https://github.com/NVIDIA/Megatron-LM; run from its root): pretrain_gpt.py with the model's shape, the layout, " +
        "and the overlap of data-parallel traffic the planner's time assumes");
      var env = (L.tp > 1 || (L.cp || 1) > 1) && L.sharding !== "zero2" && L.sharding !== "fsdp" ? "CUDA_DEVICE_MAX_CONNECTIONS=1 " : "";
      command = [env + torchrun + " pretrain_gpt.py"].concat(out[0]).join(" \\\n  ");
    }
    var seen = [], re = /<([A-Z_]+)>/g, hit;
    while ((hit = re.exec(command)) !== null) if (seen.indexOf(hit[1]) < 0) seen.push(hit[1]);
    notes.splice(1, 0, "fill in " + seen.map(function (n) { return "<" + n + "> " + ex.placeholders[n]; }).join("; "));
    return notes.map(function (n) { return "# " + n; }).concat([command]).join("\n");
  };

  // --- plan.py's answer: the band, the tie, why the winner wins and when a pipeline pays --------------------
  // (the bands and their lines are computed by Python, ppbook.planner.calibration, and come in DATA.calibration)

  // port of plan._sig: x to `digits` significant figures (at least the units)
  function sig(x, digits) {
    digits = digits || 2;
    if (x === 0 || !isFinite(x)) return String(x);
    var decimals = Math.max(0, digits - 1 - Math.floor(Math.log10(Math.abs(x))));
    return x.toFixed(decimals);
  }
  function pct1(x) { return (100 * x).toFixed(1); }

  // port of plan._band: the band of the request's framework and GPU (a GPU that is no preset: every run's)
  Planner.prototype.band = function () {
    var c = DATA.calibration, family = c.family[this.req.framework];
    return c.bands[this.req.gpu.name in family ? family[this.req.gpu.name] : family.other];
  };
  function bandStep(band, stepS) { var c = stepS * band.factor; return [c, c * (1 + band.low), c * (1 + band.high)]; }

  // port of plan.tie_slack and plan.tie
  Planner.prototype.tieSlack = function () { return Math.max(DATA.slack, this.band().high); };
  Planner.prototype.tie = function (ranked) {
    if (!ranked.length) return [];
    var top = ranked[0].step_s * (1 + Math.max(0, this.band().high));
    return ranked.filter(function (o) { return o.step_s <= top; });
  };
  // port of plan.simplicity, roomiest, simplest
  function simplicity(L) {
    var cp = L.cp || 1, ep = L.ep || 1;
    var kinds = (L.p > 1 ? 1 : 0) + (cp > 1 ? 1 : 0) + (ep > 1 ? 1 : 0) + (L.tp > 1 ? 1 : 0);
    var r = RECOMPUTE.indexOf(L.recompute);
    return [kinds, numStages(L), L.tp, cp, r < 0 ? 9 : r, SHARDING.indexOf(L.sharding)];
  }
  function lexLess(a, b) {
    for (var i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] < b[i];
    return false;
  }
  function minBy(list, key) {
    var best = list[0], bk = key(best);
    list.slice(1).forEach(function (o) { var k = key(o); if (lexLess(k, bk)) { best = o; bk = k; } });
    return best;
  }
  function roomiest(tied) { return minBy(tied, function (o) { return [o.peak_bytes, o.step_s]; }); }
  function simplest(tied) { return minBy(tied, function (o) { return simplicity(o.layout).concat([o.step_s]); }); }
  function thin(peak, usable) { return peak > usable * (1 - DATA.thin_margin); }
  Planner.prototype.freePct = function (o) { return 100 * (1 - o.peak_bytes / usableBytes(this.req)); };

  // port of plan.comfortable
  Planner.prototype.comfortable = function (ranked) {
    var usable = usableBytes(this.req), roomy = function (o) { return !thin(o.peak_bytes, usable); };
    var tied = this.tie(ranked).filter(roomy);
    if (tied.length) return roomiest(tied);
    var found = ranked.filter(roomy);
    if (found.length) return found[0];
    var wider = Object.assign({}, this.req, {headroom: 1 - (1 - this.req.headroom) * (1 - DATA.thin_margin)});
    var again = new Planner(wider).plan().ranked;
    return again.length ? this.predict(again[0].layout, true) : null;
  };

  // port of plan.margin_text
  Planner.prototype.marginText = function (ranked) {
    var req = this.req;
    if (!ranked.length || !thin(ranked[0].peak_bytes, usableBytes(req))) return null;
    var win = ranked[0];
    var text = "thin margin: the winner leaves " + this.freePct(win).toFixed(1) + "% of the usable memory free, under the " +
      (100 * DATA.thin_margin).toFixed(0) + "% the planner's memory model needs to be trusted with";
    var roomy = this.comfortable(ranked);
    if (roomy === null) return text + "; no layout leaves more";
    var which = this.tie(ranked).indexOf(roomy) >= 0 ? "the roomiest tied layout" : "the fastest layout with a comfortable margin";
    return text + "; " + which + " is " + label(roomy.layout) + ", " + (roomy.peak_bytes / GB).toFixed(1) + " GB (" +
      this.freePct(roomy).toFixed(0) + "% free), " + pct1(roomy.step_s / win.step_s - 1) + "% longer";
  };

  // port of plan.step_text and plan.throughput_text
  function stepText(stepS, band) {
    var c = bandStep(band, stepS);
    return sig(c[0]) + " s per step (" + sig(c[1]) + " to " + sig(c[2]) + " s)";
  }
  Planner.prototype.throughputText = function (pred, band) {
    var centre = pred.tokens_per_s_per_gpu / band.factor, low = centre / (1 + band.high), high = centre / (1 + band.low);
    var mfu = pred.mfu / band.factor;
    return sig(centre) + " tokens/s per GPU (" + sig(low) + " to " + sig(high) + "), " + (100 * mfu).toFixed(0) +
      "% MFU (" + (100 * mfu * low / centre).toFixed(0) + " to " + (100 * mfu * high / centre).toFixed(0) + "%)";
  };
  function passesText(pred) { return pred.estimated ? "pass times estimated from FLOPs" : "pass times measured on this GPU"; }

  // port of plan.tie_text
  Planner.prototype.tieText = function (ranked) {
    var tied = this.tie(ranked), self = this;
    if (tied.length < 2) return null;
    var win = ranked[0], b = bandStep(this.band(), win.step_s);
    var parts = ["a tie: " + tied.length + " layouts are predicted within the winner's band (" + sig(b[1]) + " to " +
      sig(b[2]) + " s), so the planner cannot rank them"];
    [["the roomiest", roomiest(tied)], ["the simplest", simplest(tied)]].forEach(function (x) {
      var name = x[0], o = x[1];
      var room = ", " + (o.peak_bytes / GB).toFixed(1) + " GB on its fullest GPU (" + self.freePct(o).toFixed(0) + "% free)";
      var longer = o === win ? "the winner itself" : pct1(o.step_s / win.step_s - 1) + "% longer";
      parts.push(name + " is " + label(o.layout) + (name === "the roomiest" ? room : "") + ", " + longer);
    });
    return parts.join("; ") + ".";
  };

  // port of plan.why_winner
  Planner.prototype.whyWinner = function (ranked) {
    if (!ranked.length) return "nothing fits: see the closest layout's memory below";
    var win = ranked[0], band = this.band(), tied = this.tieText(ranked);
    var bubble = win.layout.p === 1 ? "" : ", bubble " + pct1(win.bubble) + "%";
    var parts = [label(win.layout) + " is predicted fastest: " + stepText(win.step_s, band) + " (" + passesText(win) + "), " +
      this.throughputText(win, band) + bubble + ", " + sig(win.dp_exposed_s * band.factor) + " s of data-parallel traffic " +
      "not hidden, " + (win.peak_bytes / GB).toFixed(1) + " GB on the fullest GPU"];
    if (ranked.length > 1)
      parts.push("the runner-up (" + label(ranked[1].layout) + ") takes " + pct1(ranked[1].step_s / win.step_s - 1) + "% longer");
    var other = null;
    for (var i = 1; i < ranked.length; i++) if ((ranked[i].layout.p === 1) !== (win.layout.p === 1)) { other = ranked[i]; break; }
    if (other !== null)
      parts.push("the best " + (other.layout.p === 1 ? "layout without a pipeline" : "pipelined layout") + " (" + label(other.layout) +
        ") " + pct1(other.step_s / win.step_s - 1) + "% longer");
    var margin = this.marginText(ranked);
    return (tied ? tied + "\n" : "") + parts.join("; ") + "." + (margin ? "\n" + margin + "." : "");
  };

  // port of plan.step_terms: a step as the sum of its parts on the GPU that finishes last
  var TERMS = ["computation", "recomputation", "bubble and hand-offs", "data-parallel traffic not hidden", "optimizer step"];
  var WHY_TERMS = {"computation": "computation", "recomputation": "recomputation", "bubble and hand-offs": "bubble and hand-offs",
    "data-parallel traffic not hidden": "sharding traffic", "optimizer step": "optimizer"};
  Planner.prototype.stepTerms = function (pred) {
    var L = pred.layout, c = pred.critical, stages = this.owned(L, c.rank);
    var withRedo = this.costsOf(L).costs, without = this.costsOf(Object.assign({}, L, {recompute: "none"})).costs, redo = 0;
    stages.forEach(function (s) { ["F", "B"].forEach(function (k) { redo += withRedo[s + k] - without[s + k]; }); });
    redo *= L.m;
    return {"computation": c.busy_s - redo, "recomputation": redo, "bubble and hand-offs": c.end_s - c.busy_s,
      "data-parallel traffic not hidden": c.dp_exposed_s, "optimizer step": c.optimizer_s};
  };
  function sumLine(name, terms, k) {
    var parts = TERMS.filter(function (t) { return k * terms[t] >= 0.05 || t === "computation"; })
      .map(function (t) { return (k * terms[t]).toFixed(1) + " " + WHY_TERMS[t]; });
    var total = 0;
    TERMS.forEach(function (t) { total += terms[t]; });
    var padded = (name + "            ").slice(0, Math.max(12, name.length));
    return "  " + padded + " " + parts.join(" + ") + " = " + (k * total).toFixed(1) + " s";
  }

  // port of plan.at_batch: [step, fits] of a layout at k times this batch (null where it cannot run there)
  Planner.prototype.atBatch = function (pred, k) {
    var m = pred.layout.m * k, batch = this.req.global_batch * k;
    if (m < 1 || m !== Math.floor(m) || batch !== Math.floor(batch)) return null;
    var L = Object.assign({}, pred.layout, {m: m});
    var scaled = new Planner(Object.assign({}, this.req, {global_batch: batch}));
    if (scaled.constraintProblem(L)) return null;
    var out = scaled.predict(L, false);
    return [out.step_s, out.peak_bytes <= usableBytes(scaled.req)];
  };

  function pipelineSizesFrom(req) {
    var out = [];
    for (var p = 2; p <= req.max_p; p++) if (!req.pps.length || req.pps.indexOf(p) >= 0) out.push(p);
    return out;
  }

  // port of plan.pipeline_pays
  Planner.prototype.pipelinePays = function (ranked) {
    var req = this.req, self = this;
    ranked = ranked || [];
    var best = function (pipelined) {
      for (var i = 0; i < ranked.length; i++) if ((ranked[i].layout.p > 1) === pipelined) return ranked[i];
      var pps = pipelined ? pipelineSizesFrom(req) : [1];
      if (!pps.length) return null;
      var found = new Planner(Object.assign({}, req, {pps: pps})).plan().ranked;
      return found.length ? found[0] : null;
    };
    var without = best(false), withP = best(true);
    var flat = new Planner(Object.assign({}, req, {pps: [1]}));
    var splits = flat.candidates().some(function (c) { return !flat.constraintProblem(c); });
    var tps = this.tensorParallelSizes(), widest = (tps.length ? Math.max.apply(null, tps) : 1) *
      (req.cps.length ? Math.max.apply(null, req.cps) : 1);
    var scan = without === null || withP === null ? [] : DATA.multiples.map(function (k) {
      return [k, self.atBatch(without, k), self.atBatch(withP, k)];
    });
    return {best_without: without, best_with: withP, splits_without: splits, most_gpus_without: req.global_batch * widest,
      scan: scan, pays: withP !== null && (without === null || withP.step_s < without.step_s)};
  };

  function multipleText(k) { return k >= 1 ? String(k) : "1/" + Math.round(1 / k); }
  function rangesText(ks) { return multipleText(ks[0]) + (ks.length > 1 ? " to " + multipleText(ks[ks.length - 1]) : "") + " times"; }

  // port of plan.scan_text
  function scanText(pays) {
    var runs = [], unfit = {"the pipelined one": [], "the one without": []};
    pays.scan.forEach(function (x) {
      var k = x[0], without = x[1], withP = x[2];
      if (without === null || withP === null) return;
      var who = withP[0] < without[0] ? "the pipelined one" : "the one without";
      if (runs.length && runs[runs.length - 1][0] === who) runs[runs.length - 1][1].push(k);
      else runs.push([who, [k]]);
      if (!without[1]) unfit["the one without"].push(k);
      if (!withP[1]) unfit["the pipelined one"].push(k);
    });
    if (!runs.length) return "here neither runs at other batches";
    var text = "here the same two layouts at other batches: " + runs.map(function (r) {
      return r[0] + " faster at " + rangesText(r[1]); }).join(", ") + " this batch";
    var gaps = ["the pipelined one", "the one without"].filter(function (n) { return unfit[n].length; }).map(function (n) {
      return n + " does not fit at " + unfit[n].map(multipleText).join(", ") + " times"; });
    return text + (gaps.length ? " (" + gaps.join("; ") + ")" : "");
  }

  // port of plan.pays_text
  Planner.prototype.paysText = function (pays) {
    var req = this.req, state;
    if (!pays.splits_without) state = "not asked here: the batch does not split without one";
    else if (pays.best_without !== null)
      state = "here it fits: " + (pays.best_without.peak_bytes / GB).toFixed(1) + " GB on the fullest GPU of the best layout without one";
    else state = "here it does not: the reason a pipeline is needed";
    var batch = req.global_batch + " sequences, one replica each at most " + Math.floor(pays.most_gpus_without / req.global_batch) +
      " GPUs wide, the replicas sharing the batch evenly: at most " + pays.most_gpus_without + " GPUs; here " + req.gpus +
      (pays.splits_without ? "" : ", which the batch does not split over: the reason a pipeline is needed");
    return "  a pipeline pays when the model's state does not fit without one (" + state + "); when the GPUs outnumber " +
      "what the batch spreads over without one (" + batch + "); and otherwise where what it saves outweighs its " +
      "bubble, which the batch decides: a small batch per GPU leaves data-parallel traffic that too little " +
      "computation hides, which a pipeline's fewer replicas cut; a large batch makes the bubble, which does not " +
      "grow with it, a smaller share of the step (" + scanText(pays) + ")";
  };

  // port of plan.runtime_needs
  function runtimeNeeds(L) {
    var needs = [];
    if (["DualPipeV", "ZBVZeroBubble", "InterleavedZeroBubble", "LoopedBFS", "GPipe"].indexOf(L.schedule) >= 0)
      needs.push("Schedule" + L.schedule);
    if (L.p > 1 && L.sharding === "fsdp") needs.push("FSDP under a pipeline");
    return needs.join(", ");
  }

  // port of plan.best_for: the fastest layout framework `kind` runs, among the ranked or searched within its options
  Planner.prototype.bestFor = function (ranked, kind) {
    var self = this;
    for (var i = 0; i < ranked.length; i++) if (this.runsOn(ranked[i].layout, kind) === null) return ranked[i];
    var fw = DATA.export.frameworks[kind], req = this.req;
    var within = function (list, allowed) { return list.filter(function (x) { return allowed.indexOf(x) >= 0; }); };
    var narrowed = new Planner(Object.assign({}, req, {schedules: within(req.schedules, fw.schedules),
      shardings: within(req.shardings, fw.shardings), recomputes: within(req.recomputes, fw.recomputes)}));
    var found = narrowed.plan().ranked.filter(function (o) { return self.runsOn(o.layout, kind) === null; });
    return found.length ? found[0] : null;
  };

  // port of plan.why_lines
  Planner.prototype.whyLines = function (ranked) {
    if (!ranked.length) return [];
    var win = ranked[0], k = this.band().factor, pays = this.pipelinePays(ranked), self = this;
    var other = win.layout.p > 1 ? pays.best_without : pays.best_with, lines = [], mine = this.stepTerms(win);
    if (other !== null) {
      var theirs = this.stepTerms(other), kind = other.layout.p === 1 ? "no pipeline" : "pipelined";
      var passes = win.estimated && other.estimated ? "both estimated from FLOPs" :
        !(win.estimated || other.estimated) ? "both measured" :
        "the winner's " + (win.estimated ? "estimated" : "measured") + ", the other's " + (other.estimated ? "estimated" : "measured");
      lines.push("why: seconds per step on the GPU that finishes last (calibrated), the winner against the best " + kind +
        " layout (" + label(other.layout) + "; pass times " + passes + "):", sumLine("winner", mine, k), sumLine(kind, theirs, k));
      var diff = {}, rest = 0;
      TERMS.forEach(function (t) { diff[t] = theirs[t] - mine[t]; rest += diff[t]; });
      var bubble = diff["bubble and hand-offs"];
      rest -= bubble;
      if (win.layout.p === 1) {
        lines.push("  the pipeline " + (rest < 0 ? "saves" : "spends") + " " + Math.abs(k * rest).toFixed(1) + " s " +
          (rest < 0 ? "elsewhere" : "more elsewhere") + " and loses " + (k * bubble).toFixed(1) + " s to its bubble and hand-offs");
      } else {
        var most = null;
        TERMS.forEach(function (t) { if (t !== "bubble and hand-offs" && (most === null || diff[t] > diff[most])) most = t; });
        lines.push("  the pipeline loses " + (-k * bubble).toFixed(1) + " s to its bubble and hand-offs and saves " +
          (k * rest).toFixed(1) + " s elsewhere, most of it in " + WHY_TERMS[most]);
      }
    } else if (win.layout.p > 1) {
      lines.push("why: no layout without a pipeline " + (pays.splits_without ? "fits" : "splits this batch over the GPUs"));
    } else {
      lines.push("why: no pipelined layout fits");
    }
    lines.push(this.paysText(pays));
    var needs = runtimeNeeds(win.layout);
    if (needs) lines.push("the winner needs torch 2.13's pipelining runtime (" + needs + "): torchtitan runs it; Megatron-LM does not");
    [["torchtitan", "torchtitan 0.3.0"], ["megatron", "Megatron-LM"]].forEach(function (x) {
      var problem = self.runsOn(win.layout, x[0]);
      if (problem === null) { lines.push(x[1] + " runs the winner"); return; }
      var best = self.bestFor(ranked, x[0]);
      lines.push(x[1] + " cannot run the winner (" + problem + "); its best: " +
        (best ? label(best.layout) + ", " + pct1(best.step_s / win.step_s - 1) + "% slower" : "nothing fits"));
    });
    return lines;
  };

  // port of plan.drop_summary: what --why prints, the count of each reason (most first) and the first `limit` dropped
  function dropSummary(dropped, limit) {
    limit = limit === undefined ? 20 : limit;
    var reasons = [], count = {};
    dropped.forEach(function (o) {
      var k = (o.why_not || "").split(":")[0];
      if (!(k in count)) { count[k] = 0; reasons.push(k); }
      count[k] += 1;
    });
    var order = reasons.map(function (k, i) { return [k, i]; })
      .sort(function (a, b) { return count[b[0]] - count[a[0]] || a[1] - b[1]; });
    var lines = order.map(function (x) { return count[x[0]] + " dropped: " + x[0]; });
    dropped.slice(0, limit).forEach(function (o) { lines.push("  " + o.label + ": " + o.why_not); });
    if (dropped.length > limit) lines.push("  ... and " + (dropped.length - limit) + " more (--json lists all)");
    return lines;
  }

  // a pin of the page (stages per rank, data-parallel sizes) as the command line's --v / --dp read it:
  // whole numbers, each at least 1 (request_from's words), separated by spaces or commas; empty: no pin
  function pins(text, flag) {
    var words = String(text).trim().split(/[\s,]+/).filter(function (w) { return w !== ""; });
    return words.map(function (w) {
      if (!/^-?\d+$/.test(w)) throw new Error(flag + ": '" + w + "' is not a whole number; give sizes such as 2 4 8");
      var x = Number(w);
      if (x < 1) throw new Error(flag + " must be at least 1, got " + x);
      return x;
    });
  }

  var api = {
    TORCH_SCHEDULES: TORCH_SCHEDULES, NO_PIPELINE: NO_PIPELINE, SHARDING: SHARDING, RECOMPUTE: RECOMPUTE,
    KERNELS: KERNELS, RECIPES: Object.keys(RECIPES), GB: GB, MEMORY_KINDS: MEMORY_KINDS,
    placement: placement, stagesPerRank: stagesPerRank, stageIndices: stageIndices, scheduleProblem: scheduleProblem,
    order: order, compileOrder: compileOrder, run: run, peakInFlight: peakInFlight, simulate: simulate,
    shape: shape, fromHfConfig: fromHfConfig, validateShape: validateShape, totalParameters: totalParameters,
    activeParameters: activeParameters, routedExpertParameters: routedExpertParameters, layerActivationValues: layerActivationValues,
    layerCosts: layerCosts, headCosts: headCosts, efficiency: efficiency,
    layout: layout, label: label, numStages: numStages, usableBytes: usableBytes, Planner: Planner, pins: pins,
    sig: sig, stepText: stepText, dropSummary: dropSummary,
    load: function (data) { for (var k in data) DATA[k] = data[k]; return api; },
    data: function () { return DATA; }
  };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.PPPlanner = api;
})(typeof window !== "undefined" ? window : this);
