"""The planner page computes what the Python computes.

``planner/planner.js`` is a port of the torch-free planner (:mod:`ppbook.planner`); the page
(``book/explorer.md``) runs it in the reader's browser. Here it runs in headless Chromium, on the
data the page embeds, and must give the Python's answers on a grid: every schedule's order and
refusal (1,053 combinations), the teaching view's simulations (453), Hugging Face configs read
(and refused) the same way, 40 whole plans (ranking, memory, time, every dropped layout's
reason), 160 small plans (their ranking and first five layouts) and 320 single layouts (memory
per rank, step time and its parts, the timeline of one step). Floats agree to a relative 1e-9 (the two languages add in the same order; what is left is
the last bits of ``Math.pow`` and friends).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import asdict, replace

import pytest

from helpers.hf_configs import HF_CONFIGS
from ppbook import explorer
from ppbook.planner import hardware as H
from ppbook.planner import schedules as S
from ppbook.planner import search, shapes
from ppbook.planner.simulate import peak_in_flight, simulate

REL = 1e-9

ORDER_GRID = [(name, p, m, v) for name in S.TORCH_SCHEDULES for p in (1, 2, 3, 4, 5, 8)
              for m in range(1, 3 * p + 3) for v in ((2, 3, 4) if S.placement(name) == "loop" else (2,))]
TEACH_GRID = [(name, p, m, v, f, i, w) for name in S.TORCH_SCHEDULES for p in (2, 3, 4, 6) for m in (4, 8, 12, 16)
              for v in ((2, 3) if S.placement(name) == "loop" else (2,))
              for f, i, w in ((1, 1, 1), (2, 1, 0.5), (1.5, 2, 0.5))]
TEACH_GRID = [g for g in TEACH_GRID if S.schedule_problem(*g[:4]) is None]


@pytest.fixture(scope="module")
def js(chromium):
    """A blank page with the port and the page's data loaded; ``js(function, arg)`` calls a
    JavaScript function on ``arg`` there and returns its result."""
    page = chromium.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content("<!doctype html><title>planner</title>")
    page.add_script_tag(content=explorer.script("planner.js"))
    page.evaluate("data => PPPlanner.load(data)", explorer.planner_data())

    def evaluate(function: str, arg=None):
        # JSON text both ways: playwright's own serialization of nested arrays takes seconds
        out = page.evaluate(f"text => JSON.stringify(({function})(JSON.parse(text)))", json.dumps(arg))
        assert not errors, errors
        return json.loads(out)

    yield evaluate
    page.close()


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12) or (math.isinf(a) and a == b)


def request_json(req: search.Request) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(req).items()}


# --- schedules and the teaching view ---------------------------------------------------------------------

def test_every_order_and_refusal_is_the_pythons(js):
    got = js("""grid => grid.map(([name, p, m, v]) => {
        try { const o = PPPlanner.order(name, p, m, v);
              return Object.keys(o).map(r => o[r].map(a => [a.stage, a.kind, a.microbatch])); }
        catch (e) { return e.message; } })""", ORDER_GRID)
    refused = 0
    for (name, p, m, v), answer in zip(ORDER_GRID, got):
        problem = S.schedule_problem(name, p, m, v)
        if problem is not None:
            refused += 1
            assert answer == problem, (name, p, m, v)
            continue
        order = S.order(name, p, m, v)
        assert answer == [[[a.stage, a.kind, a.microbatch] for a in order[r]] for r in sorted(order)], (name, p, m, v)
    assert len(ORDER_GRID) == 1053 and 0 < refused < len(ORDER_GRID)


def test_the_teaching_view_simulates_as_the_python(js):
    got = js("""grid => grid.map(([name, p, m, v, f, i, w]) => {
        const k = PPPlanner.stagesPerRank(name, v), o = PPPlanner.order(name, p, m, v);
        const ev = PPPlanner.simulate(o, {F: f / k, I: i / k, W: w / k, B: (i + w) / k});
        return {events: ev.map(e => [e.rank, e.stage, e.kind, e.microbatch, e.start, e.end]),
                peak: PPPlanner.peakInFlight(o)}; })""", TEACH_GRID)
    for (name, p, m, v, f, i, w), answer in zip(TEACH_GRID, got):
        k = S.stages_per_rank(name, v)
        order = S.order(name, p, m, v)
        events = simulate(order, {"F": f / k, "I": i / k, "W": w / k, "B": (i + w) / k})
        by_action = {(e.rank, e.stage, e.kind, e.microbatch): (e.start, e.end) for e in events}
        assert len(answer["events"]) == len(events)
        for r, st, kind, mb, start, end in answer["events"]:
            assert close(start, by_action[(r, st, kind, mb)][0]) and close(end, by_action[(r, st, kind, mb)][1])
        assert {int(s): n for s, n in answer["peak"].items()} == peak_in_flight(order), (name, p, m, v)
    assert len(TEACH_GRID) == 453


# --- models ---------------------------------------------------------------------------------------------------

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 11008, "vocab_size": 32000}
BAD_CONFIGS = [{"model_type": "llama", "hidden_size": 4096},                  # no layers
               {**LLAMA, "num_attention_heads": 30, "num_key_value_heads": 30},  # hidden / heads
               {**LLAMA, "num_key_value_heads": 5},                             # heads / key-value heads
               {**LLAMA, "hidden_size": "4096"},                                # a string
               {**LLAMA, "num_hidden_layers": 32.5},                            # a fraction
               {**LLAMA, "vocab_size": 0},
               {**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 9},
               {**LLAMA, "model_type": "mixtral", "num_local_experts": 8}]      # no top-k
ODD_CONFIGS = [{**LLAMA, "hidden_size": 4096.0}, {**LLAMA, "head_dim": 256, "model_type": None, "hidden_act": "silu"},
               {**LLAMA, "model_type": "opt", "ffn_dim": None}, {k: v for k, v in LLAMA.items() if k != "model_type"}]
# the MLP read from the activation and the model type; Falcon's keys; what is not understood, refused
MLP_CONFIGS = [{**LLAMA, "model_type": "nemotron", "hidden_act": "relu2"},
               {**LLAMA, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"},
               {**LLAMA, "model_type": "mine", "hidden_act": "silu"},
               {**LLAMA, "model_type": "opt", "activation_function": "relu"},
               {"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
                "num_kv_heads": 8, "vocab_size": 65024, "bias": False, "alibi": False},
               {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                "multi_query": True, "vocab_size": 65024}]
BAD_MLP_CONFIGS = [{**LLAMA, "model_type": "mine", "hidden_act": "gelu"}, {**LLAMA, "model_type": "mine"},
                   {**LLAMA, "hidden_act": "tanh"}, {**LLAMA, "hidden_act": "relu2"}, {**LLAMA, "hidden_act": 3}]


def test_hugging_face_configs_are_read_and_refused_as_the_python_does(js):
    configs = list(HF_CONFIGS.values()) + BAD_CONFIGS + ODD_CONFIGS + MLP_CONFIGS + BAD_MLP_CONFIGS
    got = js("""cs => cs.map(c => { try { return PPPlanner.fromHfConfig(c, "config.json"); }
                                     catch (e) { return "error: " + e.message; } })""", configs)
    for config, answer in zip(configs, got):
        try:
            expected = asdict(shapes.from_hf_config(config, "config.json"))
        except ValueError as e:
            expected = f"error: {e}"
        assert answer == expected, config
    assert sum(isinstance(a, str) for a in got) == len(BAD_CONFIGS) + len(BAD_MLP_CONFIGS)  # each refused, in one line
    # the page's pins of v and dp read as the command line's --v and --dp, or refused in its words
    from ppbook import plan

    pins = [("--v", "5 7, 12"), ("--dp", "8"), ("--v", ""), ("--dp", "4 0"), ("--v", "-2")]
    got = js("""ps => ps.map(([flag, text]) => { try { return PPPlanner.pins(text, flag); }
                                                catch (e) { return "error: " + e.message; } })""", pins)
    base = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096"]
    for (flag, text), answer in zip(pins, got):
        values = text.replace(",", " ").split()
        try:
            req = plan.request_from(plan.parse_args(base + ([flag, *values] if values else [])))
            expected = list(req.vs if flag == "--v" else req.dps)
        except ValueError as e:
            expected = f"error: {e}"
        assert answer == expected, (flag, text)


# --- plans and layouts ----------------------------------------------------------------------------------------

def plan_requests() -> list[search.Request]:
    """40 requests: presets dense and mixture-of-experts, pasted configs, every GPU, modified GPUs and
    given links, one node to many, every precision and kernel choice, and batches that do not divide."""
    L = H.LINKS
    models = [shapes.PRESETS[n] for n in ("llama3-8b", "llama2-13b", "mistral-7b", "qwen2.5-14b", "mixtral-8x7b",
                                          "megatron-18b", "opt-175b", "llama3-70b")]
    models.append(shapes.from_hf_config(HF_CONFIGS["qwen2.5-7b"], "config.json"))
    models.append(shapes.from_hf_config(HF_CONFIGS["bloom-176b"], "config.json"))
    # many small experts (DeepSeekMoE 16B's sizes): expert parallelism up to 32, across nodes
    models.append(shapes.custom("moe-16b", 102400, 2048, 28, 16, 16, 10944, experts=64, top_k=6, expert_ffn=1408,
                                shared_experts=2, dense_layers=1))
    gpus = list(H.GPUS.values())
    out = []
    for k in range(40):
        model, gpu = models[k % len(models)], gpus[k % len(gpus)]
        if k % 7 == 3:
            gpu = replace(gpu, name=gpu.name + " (modified)", memory_gb=gpu.memory_gb * 1.5, bf16_tflops=700.0)
        n = (8, 16, 32, 16)[k % 4]
        per_node = 4 if k % 9 == 5 else 8
        big = shapes.total_parameters(model) > 60e9
        n = max(n, 64) if big else n
        intra = L[gpu.nvlink] if k % 5 else H.custom_link("intra (given)", 300, 3)
        inter = (L["ib-ndr400"], L["ib-hdr200"], L["roce-400g"], H.custom_link("inter (given)", 25, 8))[k % 4]
        batch = (n // per_node) * (16, 32, 24, 48)[k % 4] if k % 11 != 7 else 7 * n + 3
        out.append(search.Request(model, gpu, n, per_node, batch, (2048, 4096, 8192)[k % 3], intra, inter,
                                  recipe=("bf16", "bf16-grads", "fp32")[k % 3],
                                  kernels=("fused", "unfused", "book")[k // 3 % 3],
                                  sequence_parallel=k % 6 != 1, headroom=(0.1, 0.05)[k % 2],
                                  max_microbatch_size=(2, 4)[k % 2], fsdp_reshard=("default", "always", "never")[k % 3],
                                  stage_io=("torch", "freed")[k % 4 == 2],
                                  # pinned stages per rank (beyond max_v) and data-parallel sizes
                                  vs=(2, 5) if k % 8 == 6 else (), dps=(2, 4, 8) if k % 10 == 4 else (),
                                  # context parallelism searched, and a cp no sequence length here splits for
                                  cps=(1, 2) if k % 7 == 1 else (3,) if k == 23 else (),
                                  overlap_f_b=k % 5 == 2 or model.name == "moe-16b"))
    return out


def compare_prediction(answer: dict, pred: search.Prediction, what) -> None:
    assert answer["label"] == pred.layout.label(), what
    assert answer["why_not"] == pred.why_not, what
    for key in ("step_s", "pipeline_s", "dp_exposed_s", "optimizer_s", "bubble", "tokens_per_s_per_gpu", "mfu",
                "peak_bytes"):
        assert close(answer[key], getattr(pred, key)), (what, key, answer[key], getattr(pred, key))
    assert answer["estimated"] == pred.estimated, what
    assert len(answer["memory"]) == len(pred.memory), what
    for a, r in zip(answer["memory"], pred.memory):
        assert a["stages"] == r.stages, what
        for key in (*search.MEMORY_KINDS, "total"):
            assert close(a[key], getattr(r, key) if key != "total" else r.total), (what, r.rank, key)


PREDICTION_FIELDS = """o => ({label: o.label, why_not: o.why_not, step_s: o.step_s, pipeline_s: o.pipeline_s,
    dp_exposed_s: o.dp_exposed_s, optimizer_s: o.optimizer_s, bubble: o.bubble,
    tokens_per_s_per_gpu: o.tokens_per_s_per_gpu, mfu: o.mfu, peak_bytes: o.peak_bytes, estimated: o.estimated,
    memory: o.memory.map(r => ({stages: r.stages, parameters: r.parameters, gradients: r.gradients,
        optimizer: r.optimizer, activations: r.activations, logits: r.logits, buffers: r.buffers, total: r.total}))})"""


def test_forty_plans_are_the_pythons(js):
    """Each request planned in both: the same refusal, or the same ranked layouts with the same
    numbers, and the same dropped layouts with the same reasons."""
    requests = plan_requests()
    got = js(f"""reqs => reqs.map(req => {{
        const planner = new PPPlanner.Planner(req), problem = planner.requestProblem();
        if (problem) return {{problem}};
        const res = planner.plan(), fields = {PREDICTION_FIELDS};
        const closest = res.ranked.length ? null : planner.closest(res.dropped);
        return {{ranked: res.ranked.map(fields), dropped: res.dropped.map(o => [o.label, o.why_not]),
                 closest: closest && [closest.label, closest.peak_bytes]}}; }})""",
             [request_json(r) for r in requests])
    refused = ranked = unfit = 0
    for k, (req, answer) in enumerate(zip(requests, got)):
        problem = search.request_problem(req)
        assert answer.get("problem") == problem, k
        if problem:
            refused += 1
            continue
        expected, dropped = search.plan(req)
        assert [a["label"] for a in answer["ranked"]] == [o.layout.label() for o in expected], k
        for a, o in zip(answer["ranked"], expected):
            compare_prediction(a, o, (k, o.layout.label()))
        assert sorted(map(tuple, answer["dropped"])) == sorted((o.layout.label(), o.why_not) for o in dropped), k
        ranked += bool(expected)
        if not expected:  # nothing fits: the same closest layout, its memory counted
            nearest = search.closest(dropped, req)
            unfit += nearest is not None
            assert (answer["closest"] is None) == (nearest is None), k
            if nearest is not None:
                assert answer["closest"][0] == nearest.layout.label() and close(answer["closest"][1], nearest.peak_bytes), k
    assert refused >= 2 and ranked >= 30 and unfit >= 1  # every branch is exercised
    expert_parallel = [a["label"] for answer in got for a in answer.get("ranked", []) if " ep=" in a["label"]]
    assert any(" ep=16 " in x or " ep=32 " in x for x in expert_parallel)  # across nodes too


def small_requests(count: int = 160) -> list[search.Request]:
    """``count`` small requests (two to eight GPUs of every kind, small models, short searches):
    many whole plans cheaply, every FSDP policy, both pipeline runtimes, every precision."""
    L = H.LINKS
    models = [shapes.PRESETS[n] for n in ("llama3-8b", "qwen2.5-7b", "mistral-7b", "llama2-7b", "mixtral-8x7b",
                                          "llama2-13b", "qwen2.5-14b")]
    gpus = list(H.GPUS.values())
    out = []
    for k in range(count):
        gpu, n = gpus[k // len(models) % len(gpus)], (2, 4, 8)[k % 3]
        out.append(search.Request(models[k % len(models)], gpu, n, 4 if k % 5 == 0 else 8, n * (2, 4, 8)[k // 3 % 3],
                                  (1024, 2048, 4096)[k // 2 % 3], L[gpu.nvlink], L["ib-hdr200"], max_p=4, max_v=3,
                                  max_microbatch_size=2, fsdp_reshard=("default", "always", "never")[k % 3],
                                  stage_io=("torch", "freed")[k % 4 == 1], recipe=("bf16", "bf16-grads", "fp32")[k // 7 % 3],
                                  kernels=("fused", "unfused")[k % 2]))
    return out


def test_a_hundred_and_sixty_small_plans_are_the_pythons(js):
    """With the forty above, two hundred whole plans: the same ranking, and the first five layouts'
    numbers (memory per rank by kind, time and its parts)."""
    requests = small_requests()
    got = js(f"""reqs => reqs.map(req => {{
        const res = new PPPlanner.Planner(req).plan(), fields = {PREDICTION_FIELDS};
        return {{labels: res.ranked.map(o => o.label), top: res.ranked.slice(0, 5).map(fields),
                 dropped: res.dropped.length}}; }})""", [request_json(r) for r in requests])
    ranked = 0
    for k, (req, answer) in enumerate(zip(requests, got)):
        expected, dropped = search.plan(req)
        assert answer["labels"] == [o.layout.label() for o in expected], k
        assert answer["dropped"] == len(dropped), k
        for a, o in zip(answer["top"], expected):
            compare_prediction(a, o, (k, o.layout.label()))
        ranked += bool(expected)
    assert ranked >= 100


def sample_layouts(count: int = 320) -> list[tuple[int, search.Layout]]:
    """Every k-th candidate a schedule accepts, over the plan requests that divide: (request, layout)."""
    requests = plan_requests()
    pool = [(k, c) for k, req in enumerate(requests) if search.request_problem(req) is None
            for c in search.candidates(req) if search.constraint_problem(c, req) is None]
    step = len(pool) / count
    return [pool[int(i * step)] for i in range(count)]


def test_three_hundred_layouts_are_the_pythons(js):
    """Memory per rank, time and its parts for single layouts (fitting or not), as the page shows
    a layout the reader picks; and the timeline of one step it draws, action by action."""
    requests, chosen = plan_requests(), sample_layouts()
    got = js(f"""args => args.map(([req, L, draw]) => {{
        const planner = new PPPlanner.Planner(req), o = ({PREDICTION_FIELDS})(planner.predict(L, false));
        if (draw) o.timeline = planner.timeline(L).events.map(e => [e.rank, e.stage, e.kind, e.microbatch, e.start, e.end]);
        return o; }})""", [[request_json(requests[k]), asdict(c), i % 8 == 0] for i, (k, c) in enumerate(chosen)])
    schedules_seen = set()
    for i, ((k, layout), answer) in enumerate(zip(chosen, got)):
        req = requests[k]
        compare_prediction(answer, search.predict(layout, req, check_memory=False), (k, layout.label()))
        schedules_seen.add(layout.schedule)
        if i % 8 == 0:
            events = search.timeline(layout, req)
            assert len(answer["timeline"]) == len(events)
            for (r, st, kind, mb, start, end), e in zip(answer["timeline"], events):
                assert (r, st, kind, mb) == (e.rank, e.stage, e.kind, e.microbatch)
                assert close(start, e.start) and close(end, e.end), (k, layout.label())
    assert schedules_seen == set(S.TORCH_SCHEDULES) | {search.NO_PIPELINE}
    assert any(c.ep > 1 and c.schedule == "DualPipeV" for _, c in chosen) and any(c.ep > 1 for _, c in chosen)
    # experts folded over tensor parallelism (ep beyond dp), and split by expert tensor parallelism
    assert any(c.ep > c.dp for _, c in chosen) and any(c.etp > 1 for _, c in chosen)
    assert any(c.cp > 1 for _, c in chosen)


# --- the page -------------------------------------------------------------------------------------------------

def test_the_page_is_self_contained_and_light():
    html = explorer.page()
    assert explorer.weight() == len(html.encode()) < 200_000  # the budget of book/explorer.md's ppx_kb
    assert not re.search(r"""(src|href)=["']?https?:""", html)  # offline: nothing fetched
    payload = re.search(r'<script type="application/json" id="ppx-data">(.*?)</script>', html, re.S).group(1)
    data = json.loads(payload.replace("<\\/", "</"))
    assert data == json.loads(json.dumps(explorer.planner_data()))
    assert data["presets"]["llama3-70b"] == asdict(shapes.PRESETS["llama3-70b"])  # exported, never typed twice


def test_the_page_data_starts_from_a_request_that_plans():
    d = explorer.DEFAULT_REQUEST
    gpu = H.GPUS[d["gpu"]]
    req = search.Request(shapes.PRESETS[d["model"]], gpu, d["gpus"], d["gpus_per_node"], d["global_batch"],
                         d["seq_len"], H.LINKS[gpu.nvlink], H.LINKS[gpu.network])
    assert search.plan(req)[0]


def test_the_pages_screenshot_shows_the_page_as_it_is():
    """book/images/planner.png carries the digest of the page it was taken with; a change to the
    page (its drawing, the port, the data) asks for a new one:
    ``make book && .venv/bin/python tools/screenshot_planner.py``."""
    from screenshot_planner import DIGEST_KEY, text_chunks

    from conftest import ROOT

    # the numbers count, not only the code: a preset, a measured row or the opening request moved
    data = explorer.planner_data()
    for moved in ({"presets": {**data["presets"], "llama3-70b": {**data["presets"]["llama3-70b"], "layers": 81}}},
                  {"measured": {**data["measured"], "rows": [
                      [v * 1.01 if k == "F_ms" else v for k, v in zip(data["measured"]["keys"], data["measured"]["rows"][0])],
                      *data["measured"]["rows"][1:]]}},
                  {"request": {**data["request"], "gpus": 2 * data["request"]["gpus"]}}):
        assert explorer.source_digest({**data, **moved}) != explorer.source_digest(), list(moved)
    taken = text_chunks((ROOT / "book" / "images" / "planner.png").read_bytes()).get(DIGEST_KEY)
    assert taken == explorer.source_digest(), (
        "the planner page changed since its screenshot was taken: make book && "
        ".venv/bin/python tools/screenshot_planner.py")


# --- exports --------------------------------------------------------------------------------------------------

def test_the_exports_are_the_pythons(js):
    """The page's export of a layout, torchtitan 0.3.0 job or Megatron-LM arguments, is
    ``python -m ppbook.plan --export``'s, text for text, and refuses what it refuses in its words."""
    from ppbook import plan

    H100, L = H.GPUS["h100-sxm"], H.LINKS
    requests = [search.Request(shapes.PRESETS[name], H100, gpus, 8, batch, 4096, L["nvlink-h100"], L["ib-ndr400"],
                               sequence_parallel=sp)
                for name, gpus, batch, sp in (("llama3-70b", 64, 128, True), ("mistral-7b", 8, 64, False),
                                              ("mixtral-8x7b", 16, 64, True))]
    # DualPipeV's overlap of the all-to-all, which torchtitan 0.3.0 does not run: refused alike
    requests.append(replace(requests[-1], overlap_f_b=True))
    # issue 52: the dispatcher, a capacity factor, FP8 and the optimizer reach the exports (Adafactor: Megatron refuses)
    requests += [replace(requests[2], precision="fp8-current", dispatcher="deepep", optimizer="adamw-bf16"),
                 replace(requests[2], precision="fp8-delayed", capacity_factor=1.25, optimizer="muon"),
                 replace(requests[2], optimizer="adafactor")]
    layouts = [search.Layout(4, 4, 4, "Interleaved1F1B", 2, 1, 32, "fsdp", "selective", "ends"),
               search.Layout(4, 4, 4, "Interleaved1F1B", 3, 1, 32, "zero1", "full"),
               search.Layout(8, 2, 4, "1F1B", 1, 2, 16, "zero2", "full", "ends"),
               search.Layout(2, 1, 32, search.NO_PIPELINE, 1, 2, 2, "none", "none"),
               search.Layout(1, 2, 4, "DualPipeV", 2, 1, 16, "fsdp", "none", "even", 2),
               search.Layout(2, 4, 2, "GPipe", 1, 1, 32, "none", "full"),
               search.Layout(2, 2, 4, "1F1B", 1, 2, 8, "zero1", "full", "even", 4, 1, 2)]  # each expert on etp 2
    def fitted(x, r):  # the layout on this request's GPUs and batch
        dp = r.gpus // (x.tp * x.p)
        return replace(x, dp=dp, m=max(1, r.global_batch // (dp * x.b)), ep=x.ep if r.model.moe else 1,
                       etp=x.etp if r.model.moe else 1)

    cases = [(r, fitted(x, r), kind) for r in requests for x in layouts if r.gpus % (x.tp * x.p) == 0
             for kind in ("torchtitan", "megatron")]
    got = js("""cases => cases.map(([req, L, kind]) => {
        try { return new PPPlanner.Planner(req).exportText(L, kind); } catch (e) { return "error: " + e.message; } })""",
             [[request_json(r), asdict(x), kind] for r, x, kind in cases])
    refused = 0
    for (req, layout, kind), answer in zip(cases, got):
        try:
            expected = plan.export(search.Prediction(layout), req, kind)
        except ValueError as e:
            expected, refused = f"error: {e}", refused + 1
        assert answer == expected, (req.model.name, layout.label(), kind)
    assert refused >= 4 and len(cases) - refused >= 10  # both branches, each framework


# --- the answer: the tie, the winner, why, when a pipeline pays ------------------------------------------------

def answer_requests() -> list[search.Request]:
    """Requests whose answers take every branch: issue 51's question (a tie, a winner without a
    pipeline, the caution) for each framework, a thin margin, a pipelined winner, an A100, a model whose
    state does not fit without a pipeline, a batch too small to spread without one, context
    parallelism, and a request nothing fits."""
    L, G = H.LINKS, H.GPUS
    h100 = G["h100-sxm"]

    def req(model, gpus, batch, seq, gpu=h100, **kw):
        return search.Request(shapes.PRESETS[model], gpu, gpus, 8, batch, seq, L[gpu.nvlink], L[gpu.network], **kw)

    return [req("llama3-70b", 64, 512, 8192), req("llama3-70b", 64, 512, 8192, framework="megatron"),
            req("llama3-70b", 64, 512, 8192, gpu=replace(h100, name="h100-sxm (modified)", memory_gb=80.0)),
            req("mixtral-8x7b", 16, 256, 4096), req("llama3-8b", 16, 64, 4096, gpu=G["a100-80gb"], framework="megatron"),
            req("llama3-405b", 128, 128, 8192, shardings=("none", "zero1")), req("llama3-8b", 128, 8, 4096),
            req("llama3-8b", 16, 32, 16384, cps=(1, 2)), req("llama3-405b", 8, 8, 8192)]


def test_the_answer_is_the_pythons(js):
    """The page's answer is the command line's, line for line: the search reaching the winner's band,
    the tie and its roomiest and simplest layouts, the winner with its band and whether its pass times
    were measured, the margin, the why-lines and when a pipeline pays; and the band and cautions the
    page shows are the Python's."""
    from ppbook import plan
    from ppbook.planner import calibration

    requests = answer_requests()
    got = js("""reqs => reqs.map(req => {
        const planner = new PPPlanner.Planner(req), ranked = planner.plan(planner.tieSlack()).ranked;
        return {labels: ranked.map(o => o.label), tie: planner.tie(ranked).map(o => o.label),
                winner: planner.whyWinner(ranked), why: planner.whyLines(ranked), band: planner.band()}; })""",
             [request_json(r) for r in requests])
    tied = 0
    for req, answer in zip(requests, got):
        ranked, _ = search.plan(req, slack=plan.tie_slack(req))
        assert answer["labels"] == [o.layout.label() for o in ranked], req.model.name
        assert answer["tie"] == [o.layout.label() for o in plan.tie(ranked, req)]
        assert answer["winner"] == plan.why_winner(ranked, req), req.model.name
        assert answer["why"] == plan.why_lines(ranked, req), req.model.name
        band = plan._band(req)
        assert answer["band"]["describe"] == band.describe() and close(answer["band"]["factor"], band.factor)
        assert answer["band"]["cautions"] == calibration.cautions(req.gpu.name, req.framework)
        tied += len(answer["tie"]) > 1
    assert tied >= 3 and any("thin margin" in a["winner"] for a in got)
    assert any("here it does not: the reason a pipeline is needed" in " ".join(a["why"]) for a in got)
    assert any("which the batch does not split over" in " ".join(a["why"]) for a in got)
    assert got[-1]["winner"].startswith("nothing fits") and got[-1]["why"] == []


@pytest.fixture(scope="module")
def planner_page_here(chromium):
    """The planner page's fragment (``explorer.page()``, what the book embeds) on a bare page at a
    desktop's width: the form, the answer and the drawings, without building the book."""
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content('<!doctype html><html><head><meta charset="utf-8"><title>planner</title></head><body>'
                     + explorer.page() + "</body></html>")
    page.wait_for_function("() => document.getElementById('ppx').dataset.plans === '1'", timeout=120_000)
    yield page, errors
    page.close()


def test_the_page_answers_issue_51s_question_as_the_command_line(planner_page_here, tmp_path):
    """70B on 64 H100s, 512 x 8192: the page prints the tie with its roomiest layout, whether each
    time's pass times were measured or estimated, the family that calibrates it with its measured
    bias and the caution, and the why-lines, each as `python -m ppbook.plan` prints it; a layout
    without a pipeline shows no bubble, and the timeline's axis covers the whole step."""
    import planner_page

    from ppbook import plan

    page, errors = planner_page_here
    planner_page.request(page, model="llama3-70b", gpu="h100-sxm", gpus=64, global_batch=512, seq_len=8192)
    shown = planner_page.answer(page)
    out = tmp_path / "plan.json"
    assert plan.main(["--model", "llama3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--global-batch", "512",
                      "--seq-len", "8192", "--json", str(out)]) == 0
    cli = json.loads(out.read_text())
    assert shown["winner_reason"] == cli["winner_reason"] and shown["why_lines"] == cli["why"]
    first = cli["winner_reason"].splitlines()[0]
    assert first.startswith("a tie: ") and "the roomiest is " in first and "the simplest is " in first
    assert shown["answer"].splitlines()[0] == first  # the answer's first line on the page
    assert "(pass times estimated from FLOPs)" in shown["answer"]
    assert all(line in shown["why"] for line in cli["why"])
    # --why's list of the dropped layouts, as the command line prints it
    dropped = [search.Prediction(search.Layout(**{k: o[k] for k in search.Layout.__dataclass_fields__}),
                                 why_not=o["why_not"]) for o in cli["dropped"]]
    assert shown["dropped"] == "\n".join(plan.drop_summary(dropped))
    assert shown["calibration"] == f"Times printed: {calibration_line(cli)}."
    assert shown["calibration"].startswith("Times printed: calibrated as torchtitan on H100s: 4 published runs")
    assert shown["caution"] == " ".join(cli["cautions"]) and shown["caution"].startswith("caution: uncorrected")
    # the table: ties marked, pass times measured or estimated, no bubble without a pipeline
    assert shown["head"][-1] == "passes" and all(shown["tied"])  # the ten shown all tie here
    bubble, pp = shown["head"].index("bubble"), shown["head"].index("pp")
    assert {row[-1] for row in shown["cells"]} == {"est.", "meas."}
    assert all((row[bubble] == "–") == (row[pp] == "1") for row in shown["cells"])
    assert "bubble" not in planner_page.selected(page)["stats"]  # the winner has no pipeline
    assert shown["axis"] >= shown["step"] * (1 - 1e-12) and shown["step"] > 0
    assert not errors, errors


def calibration_line(cli: dict) -> str:
    from ppbook.planner import calibration

    band = calibration.Band(**cli["calibration"])
    return band.describe()


def test_the_page_says_the_framework_calibrates_its_times(planner_page_here):
    """The framework the reader will run picks the family: Megatron-LM on H100s has no runs of its
    own, so every framework's H100 runs calibrate it, and the caution points to torchtitan's."""
    import planner_page

    page, errors = planner_page_here
    planner_page.request(page, model="llama3-8b", gpu="h100-sxm", gpus=8, global_batch=64, seq_len=4096,
                         framework="megatron")
    shown = planner_page.answer(page)
    assert shown["calibration"].startswith("Times printed: calibrated as every framework on H100s")
    assert "plan with --framework torchtitan" in shown["caution"]
    assert page.input_value("#ppx-export-kind") == "megatron"
    planner_page.request(page, model="llama3-8b", gpu="a100-80gb", gpus=8, global_batch=64, seq_len=4096,
                         framework="torchtitan")
    assert planner_page.answer(page)["caution"] == ""
    assert not errors, errors
