"""Model shapes: the published architectures readers train, a reader's own Hugging Face
``config.json``, and exact parameter counts.

Introduced in "Choosing a pipeline". A :class:`ModelShape` holds what the planner needs of a
decoder-only transformer: its sizes, which kind of MLP, norm and position encoding it uses,
whether it has biases or tied embeddings, and, for mixtures of experts, its experts. The
parameter counts are exact for these architectures; ``tests/test_plan.py`` checks
every preset against its published count (within 1%) and the Llama shapes against the book's own
model built in torch.

What "published" means differs by family. For the Llama, Mistral, Mixtral and Qwen presets it
is the count the Hugging Face Hub shows for the released checkpoint (e.g. "8.03B params"), which
the Hub computes from the checkpoint's tensors: it is the exact count rounded, so the test checks
that each shape is the released checkpoint's, to the rounding, rather than comparing with an
independent estimate (the model cards and reports round further: "8B", "70B", "405B"). For the
GPT-3-style models, BLOOM and DeepSeek-V3 it is the authors' own figure, from the paper named in
``source``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path


def hashed_once(obj) -> int:
    """``__hash__`` of a frozen dataclass that the planner's caches look up very often: its fields'
    hash, computed on the first call and kept on the instance (ModelShape, search.Request)."""
    cached = obj.__dict__.get("_hash")
    if cached is None:
        cached = hash(tuple(getattr(obj, f.name) for f in fields(obj)))
        object.__setattr__(obj, "_hash", cached)
    return cached


def state_without_hash(obj) -> dict:
    """``__getstate__`` to go with :func:`hashed_once`: a pickled copy hashes anew, as another
    process salts the hashes of strings differently."""
    return {k: v for k, v in obj.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int                   # MLP width of a dense layer
    tied: bool = False         # the output head reuses the embedding matrix
    mlp: str = "swiglu"        # gated, three matrices (gate, up, down): "swiglu", "geglu"; two: "gelu", "relu", "relu2"
    norm: str = "rms"          # "rms": a scale per norm; "layer": a scale and a bias
    bias: bool = False         # every linear layer has a bias (GPT-3, BLOOM, OPT)
    qkv_bias: bool = False     # only the query, key and value projections do (Qwen2)
    position: str = "rope"     # "rope" or "alibi" (no parameters), "learned" (a table of max_positions rows)
    max_positions: int = 0
    embed_norm: bool = False   # a layer norm right after the embedding (BLOOM)
    head_dim: int = 0          # 0: hidden / heads
    # mixture of experts (0 experts: every layer dense)
    experts: int = 0           # routed experts of an MoE layer
    top_k: int = 0             # experts each token is routed to
    expert_ffn: int = 0        # MLP width of one expert
    shared_experts: int = 0    # experts every token goes through (DeepSeek), of width expert_ffn each
    dense_layers: int = 0      # the first layers stay dense (DeepSeek-V3: 3)
    router_bias: bool = False  # a per-expert routing bias (DeepSeek-V3's e_score_correction_bias)
    # multi-head latent attention (DeepSeek-V2/V3); 0: ordinary (grouped-query) attention
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0
    v_head_dim: int = 0
    published_params: float = 0.0  # the count its authors give (0: none), for the tests and the output
    source: str = ""

    # the planner's caches look shapes up hundreds of thousands of times: hashed once
    __hash__ = hashed_once
    __getstate__ = state_without_hash

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0


GATED_MLPS = ("swiglu", "geglu")  # three matrices: gate, up, down
MLPS = (*GATED_MLPS, "gelu", "relu", "relu2")  # the others: two (up, down)


def gated(shape: ModelShape) -> bool:
    """Whether the MLP is gated (SwiGLU, GeGLU: three matrices) rather than two matrices around an
    activation (GELU, ReLU, squared ReLU)."""
    return shape.mlp in GATED_MLPS


# --- parameter counts -------------------------------------------------------------------------------

def _norm(shape: ModelShape, width: int) -> int:
    return width * (2 if shape.norm == "layer" else 1)


def attention_parameters(shape: ModelShape) -> int:
    """One layer's attention: query, key, value and output projections (GQA: key and value at
    ``kv_heads`` heads), or multi-head latent attention's low-rank projections and their norms."""
    h = shape.hidden
    if shape.mla:
        q_head = shape.qk_nope_dim + shape.qk_rope_dim
        q = (h * shape.q_lora_rank + shape.q_lora_rank + shape.q_lora_rank * shape.heads * q_head
             if shape.q_lora_rank else h * shape.heads * q_head)
        kv = (h * (shape.kv_lora_rank + shape.qk_rope_dim) + shape.kv_lora_rank
              + shape.kv_lora_rank * shape.heads * (shape.qk_nope_dim + shape.v_head_dim))
        return q + kv + shape.heads * shape.v_head_dim * h
    q, kv = shape.heads * shape.hd, shape.kv_heads * shape.hd
    weights = h * q + 2 * h * kv + q * h
    biases = (q + 2 * kv + h) if shape.bias else (q + 2 * kv) if shape.qkv_bias else 0
    return weights + biases


def mlp_parameters(shape: ModelShape, width: int) -> int:
    """One MLP of inner width ``width``: SwiGLU's three matrices, or a GELU MLP's two (with biases)."""
    h = shape.hidden
    if gated(shape):
        return 3 * h * width + (2 * width + h if shape.bias else 0)
    return 2 * h * width + (width + h if shape.bias else 0)


@functools.lru_cache(maxsize=1024)
def layer_parameters(shape: ModelShape, index: int = 0) -> int:
    """Parameters of layer ``index``: two norms, attention, and a dense MLP or an MoE layer
    (router, routed and shared experts)."""
    norms = 2 * _norm(shape, shape.hidden)
    if shape.moe and index >= shape.dense_layers:
        router = shape.hidden * shape.experts + (shape.experts if shape.router_bias else 0)
        experts = (shape.experts + shape.shared_experts) * mlp_parameters(shape, shape.expert_ffn)
        return norms + attention_parameters(shape) + router + experts
    return norms + attention_parameters(shape) + mlp_parameters(shape, shape.ffn)


def routed_expert_parameters(shape: ModelShape, index: int = 0) -> int:
    """Parameters of layer ``index``'s routed experts: what expert parallelism divides among its
    ranks (the router, shared experts, attention and norms stay on every rank); 0 for a dense layer."""
    if not (shape.moe and index >= shape.dense_layers):
        return 0
    return shape.experts * mlp_parameters(shape, shape.expert_ffn)


def linear_parameters(shape: ModelShape, index: int = 0) -> int:
    """Parameters of layer ``index``'s linear layers, the matrices an FP8 recipe runs in FP8 (and their
    biases): the layer's parameters less its two norms and an MoE layer's router, which stay bf16."""
    router = (shape.hidden * shape.experts + (shape.experts if shape.router_bias else 0)
              if shape.moe and index >= shape.dense_layers else 0)
    return layer_parameters(shape, index) - 2 * _norm(shape, shape.hidden) - router


def active_layer_parameters(shape: ModelShape, index: int = 0) -> int:
    """Parameters one token uses in layer ``index``: an MoE layer's router, shared experts and
    ``top_k`` routed experts; a dense layer's all."""
    if not (shape.moe and index >= shape.dense_layers):
        return layer_parameters(shape, index)
    norms = 2 * _norm(shape, shape.hidden)
    used = (shape.top_k + shape.shared_experts) * mlp_parameters(shape, shape.expert_ffn)
    return norms + attention_parameters(shape) + shape.hidden * shape.experts + used


def embedding_parameters(shape: ModelShape) -> int:
    """The first stage's extra parameters: token embedding, a learned position table, BLOOM's
    embedding norm."""
    h = shape.hidden
    return (shape.vocab * h + (shape.max_positions * h if shape.position == "learned" else 0)
            + (_norm(shape, h) if shape.embed_norm else 0))


def head_parameters(shape: ModelShape) -> int:
    """The last stage's extra parameters: the final norm and the output head (a copy of the
    embedding matrix when tied: a pipeline holds it on the last stage too, and sums the two
    gradients)."""
    return _norm(shape, shape.hidden) + shape.vocab * shape.hidden


def total_parameters(shape: ModelShape) -> int:
    """The model's parameters, each counted once (a tied head is the embedding)."""
    head = head_parameters(shape) - (shape.vocab * shape.hidden if shape.tied else 0)
    return embedding_parameters(shape) + sum(layer_parameters(shape, i) for i in range(shape.layers)) + head


def active_parameters(shape: ModelShape) -> int:
    """Parameters one token uses (equal to :func:`total_parameters` for a dense model)."""
    head = head_parameters(shape) - (shape.vocab * shape.hidden if shape.tied else 0)
    return (embedding_parameters(shape) + sum(active_layer_parameters(shape, i) for i in range(shape.layers))
            + head)


def block_weight_groups(shape: ModelShape, moe_layer: bool = False) -> int:
    """How many groups of parameters torch's weight-gradient pass ``W`` differentiates apart in one
    block: torch 2.13's ``stage_backward_weight`` calls ``torch.autograd.grad`` once per group of
    parameters that reach the block's graph through the same operation
    (``torch.distributed.pipelining._backward.get_param_groups``), so a linear layer's weight and
    bias are one group, a norm's scale and bias one, and each other weight its own. Counted for the
    layers as the book's block, Hugging Face's Llama and torchtitan's write them: two norms, separate
    query, key, value and output projections (multi-head latent attention: its down- and
    up-projections and their norms), the MLP's matrices, and in a mixture-of-experts layer the
    router, the routed experts' stacked matrices (torchtitan's ``GroupedExperts``) and the shared
    experts' (``tests/test_planner_memory.py`` checks it against torch's grouping on the book's
    blocks). Under full checkpointing each group recomputes the block's forward once more
    (chapter 12 measured 11 forwards per Llama block, 2 + 9 groups)."""
    norms = 2
    if shape.mla:
        attention = (3 if shape.q_lora_rank else 1) + 3 + 1  # q (down, norm, up) | kv (down, norm, up) | output
    else:
        attention = 4
    matrices = 3 if gated(shape) else 2
    if moe_layer:
        mlp = 1 + matrices + (matrices if shape.shared_experts else 0)
    else:
        mlp = matrices
    return norms + attention + mlp


# --- presets ------------------------------------------------------------------------------------------

def _llama(name, vocab, hidden, layers, heads, kv, ffn, published, source, **kw) -> ModelShape:
    return ModelShape(name, vocab, hidden, layers, heads, kv, ffn, published_params=published, source=source, **kw)


def _gpt(name, vocab, hidden, layers, heads, published, source, **kw) -> ModelShape:
    """A GPT-3-style model: GELU MLP of width 4h, layer norms, biases, tied embeddings."""
    kw = {"position": "learned", "max_positions": 2048, **kw}
    return ModelShape(name, vocab, hidden, layers, heads, heads, 4 * hidden, tied=True, mlp="gelu", norm="layer",
                      bias=True, published_params=published, source=source, **kw)


_HF = "the model's config.json on the Hugging Face Hub"  # its count: the Hub's, of the checkpoint's tensors
PRESETS: dict[str, ModelShape] = {s.name: s for s in [
    _llama("llama2-7b", 32000, 4096, 32, 32, 32, 11008, 6.74e9, _HF),
    _llama("llama2-13b", 32000, 5120, 40, 40, 40, 13824, 13.0e9, _HF),
    _llama("llama2-70b", 32000, 8192, 80, 64, 8, 28672, 69.0e9, _HF),
    _llama("llama3-8b", 128256, 4096, 32, 32, 8, 14336, 8.03e9, _HF + " (Llama 3 and 3.1 share the shape)"),
    _llama("llama3-70b", 128256, 8192, 80, 64, 8, 28672, 70.6e9, _HF),
    _llama("llama3-405b", 128256, 16384, 126, 128, 8, 53248, 405.9e9, _HF + "; the Llama 3 paper, Table 3"),
    _llama("mistral-7b", 32000, 4096, 32, 32, 8, 14336, 7.24e9, _HF + " (Mistral-7B-v0.1)"),
    _llama("mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336, 46.7e9, _HF + "; Mixtral paper: 47B total, 13B active",
           experts=8, top_k=2, expert_ffn=14336),
    _llama("mixtral-8x22b", 32768, 6144, 56, 48, 8, 16384, 141e9, _HF + "; Mistral AI: 141B total, 39B active",
           experts=8, top_k=2, expert_ffn=16384),
    _llama("qwen2.5-7b", 152064, 3584, 28, 28, 4, 18944, 7.61e9, _HF + "; Qwen2.5 report: 7.61B", qkv_bias=True),
    _llama("qwen2.5-14b", 152064, 5120, 48, 40, 8, 13824, 14.7e9, _HF + "; Qwen2.5 report: 14.7B", qkv_bias=True),
    _llama("qwen2.5-32b", 152064, 5120, 64, 40, 8, 27648, 32.5e9, _HF + "; Qwen2.5 report: 32.5B", qkv_bias=True),
    _llama("qwen2.5-72b", 152064, 8192, 80, 64, 8, 29568, 72.7e9, _HF + "; Qwen2.5 report: 72.7B", qkv_bias=True),
    # Qwen3 mixtures of experts: every layer an MoE layer (decoder_sparse_step 1), 128 experts, 8 a token, head_dim 128
    _llama("qwen3-30b-a3b", 151936, 2048, 48, 32, 4, 6144, 30.5e9, _HF + "; Qwen3 report: 30.5B total, 3.3B active",
           head_dim=128, experts=128, top_k=8, expert_ffn=768),
    _llama("qwen3-235b-a22b", 151936, 4096, 94, 64, 4, 12288, 235e9, _HF + "; Qwen3 report: 235B total, 22B active",
           head_dim=128, experts=128, top_k=8, expert_ffn=1536),
    _gpt("gpt3-175b", 50257, 12288, 96, 96, 175e9, "Brown et al. 2020, Table 2.1"),
    _gpt("opt-175b", 50272, 12288, 96, 96, 175e9, "Zhang et al. 2022 (OPT), Table 1", max_positions=2050),
    ModelShape("bloom-176b", 250880, 14336, 70, 112, 112, 4 * 14336, tied=True, mlp="gelu", norm="layer", bias=True,
               position="alibi", embed_norm=True, published_params=176.2e9,
               source="BigScience, BLOOM (Le Scao et al. 2022), Table 3; " + _HF),
    _gpt("mt-nlg-530b", 51200, 20480, 105, 128, 530e9, "Smith et al. 2022 (MT-NLG), section 3.1"),
    # Megatron-LM 2021 (Narayanan et al.), Table 1: GPT models, vocabulary 51,200, sequence 2,048
    _gpt("megatron-18b", 51200, 6144, 40, 48, 18.4e9, "Narayanan et al. 2021, Table 1"),
    _gpt("megatron-39b", 51200, 8192, 48, 64, 39.1e9, "Narayanan et al. 2021, Table 1"),
    _gpt("megatron-76b", 51200, 10240, 60, 80, 76.1e9, "Narayanan et al. 2021, Table 1"),
    _gpt("megatron-145b", 51200, 12288, 80, 96, 145.6e9, "Narayanan et al. 2021, Table 1"),
    _gpt("megatron-310b", 51200, 16384, 96, 128, 310.1e9, "Narayanan et al. 2021, Table 1"),
    _gpt("megatron-530b", 51200, 20480, 105, 128, 529.6e9, "Narayanan et al. 2021, Table 1"),
    _gpt("megatron-1t", 51200, 25600, 128, 160, 1008.0e9, "Narayanan et al. 2021, Table 1"),
    ModelShape("deepseek-v3", 129280, 7168, 61, 128, 128, 18432, experts=256, top_k=8, expert_ffn=2048,
               shared_experts=1, dense_layers=3, router_bias=True, q_lora_rank=1536, kv_lora_rank=512,
               qk_rope_dim=64, qk_nope_dim=128, v_head_dim=128, published_params=671e9,
               source="DeepSeek-V3 technical report: 671B total (without the 14B multi-token prediction module), "
                      "37B active; " + _HF),
]}


# --- a reader's own model -------------------------------------------------------------------------------

# Hugging Face model types by their MLP: gated (three matrices) or two matrices around an activation
GATED_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
               "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "granite", "phi3", "cohere", "internlm2")
TWO_MATRIX_TYPES = ("gpt2", "gpt_neox", "bloom", "opt", "gpt_bigcode", "falcon", "nemotron", "phi", "starcoder2")
GPT_TYPES = ("gpt2", "gpt_neox", "bloom", "opt", "gpt_bigcode")  # layer norms, biases everywhere
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
               "gelu_pytorch_tanh": "gelu", "quick_gelu": "gelu", "relu": "relu", "relu2": "relu2"}
ACTIVATION_KEYS = ("hidden_act", "activation_function", "hidden_activation", "activation")


def mlp_of(kind: str, act, name: str) -> str:
    """The MLP of a Hugging Face model type with activation ``act`` (``None``: not given), from
    :data:`MLPS`; a ``ValueError`` in one line for what the planner cannot tell, never a guess."""
    if act is not None and (not isinstance(act, str) or act.lower() not in ACTIVATIONS):
        raise ValueError(f"{name}: activation {json.dumps(act)} is not one the planner reads "
                         f"({', '.join(ACTIVATIONS)}); give a config with one of them")
    family = ACTIVATIONS[act.lower()] if act is not None else None
    if kind in TWO_MATRIX_TYPES:
        is_gated, family = False, family or "gelu"
    elif kind in GATED_TYPES:
        is_gated, family = True, family or "silu"
    elif family in ("silu", "relu2"):  # SiLU MLPs are gated (SwiGLU) and squared ReLU's are not, wherever used
        is_gated = family == "silu"
    else:
        raise ValueError(f"{name}: model_type {kind!r} " + (f"with activation {act!r}" if act else "without an activation")
                         + ": the planner cannot tell a gated MLP (three matrices) from a plain one (two); give "
                         f"hidden_act and a model_type it reads ({', '.join(GATED_TYPES + TWO_MATRIX_TYPES)})")
    if is_gated:
        if family in ("silu", "gelu"):
            return "swiglu" if family == "silu" else "geglu"
        raise ValueError(f"{name}: a gated MLP with {act!r} is not one the planner reads; it reads SwiGLU and GeGLU")
    if family == "silu":
        raise ValueError(f"{name}: a two-matrix MLP with {act!r} is not one the planner reads; it reads GELU and ReLU")
    return family

def from_hf_config(config: dict, name: str = "config.json") -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (as a dict): Llama, Mistral,
    Mixtral, Qwen2/3 (and their MoE), Gemma, GPT-2/GPT-NeoX-style, BLOOM, OPT, Falcon, Nemotron and
    DeepSeek-V2/V3 keys, the MLP read from the activation and the model type (:func:`mlp_of`).
    A ``ValueError`` names what is missing or not understood."""
    c = dict(config)
    kind = str(c.get("model_type", "llama")).lower()

    def get(*keys, default=None):
        for k in keys:
            if k in c and c[k] is not None:
                return c[k]
        if default is not None:
            return default
        raise ValueError(f"{name}: no {' or '.join(repr(k) for k in keys)} (model_type {kind!r}); "
                         "give a Hugging Face config.json of a decoder-only transformer")

    def whole(*keys, default=None) -> int:
        value = get(*keys, default=default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
            found = next((k for k in keys if c.get(k) is not None), keys[0])
            raise ValueError(f"{name}: {found!r} must be a whole number, got {json.dumps(value)}")
        return int(value)

    hidden = whole("hidden_size", "n_embd", "n_embed", "d_model")
    layers = whole("num_hidden_layers", "n_layer", "num_layers")
    heads = whole("num_attention_heads", "n_head", "num_heads")
    # Falcon: num_kv_heads (new decoder architecture), or multi_query (one key/value head)
    kv = whole("num_key_value_heads", "multi_query_group_num", "num_kv_heads", default=1 if c.get("multi_query") else heads)
    vocab = whole("vocab_size", "padded_vocab_size")
    tied = bool(get("tie_word_embeddings", default=kind in ("gpt2", "bloom", "opt", "falcon")))
    act = next((c[k] for k in ACTIVATION_KEYS if c.get(k) is not None), None)
    mlp = mlp_of(kind, act, name)
    if kind in GPT_TYPES:
        ffn = whole("ffn_dim", "intermediate_size", "n_inner", default=4 * hidden) or 4 * hidden
        position = {"bloom": "alibi", "gpt_neox": "rope"}.get(kind, "learned")
        max_pos = whole("n_positions", "max_position_embeddings", default=2048) + (2 if kind == "opt" else 0)
        return validate(ModelShape(name, vocab, hidden, layers, heads, kv, ffn, tied=tied, mlp=mlp, norm="layer",
                                   bias=True, position=position, max_positions=max_pos if position == "learned" else 0,
                                   embed_norm=kind == "bloom"))
    if kind == "falcon":
        return validate(ModelShape(name, vocab, hidden, layers, heads, kv, whole("ffn_hidden_size", default=4 * hidden),
                                   tied=tied, mlp=mlp, norm="layer", bias=bool(c.get("bias", False)),
                                   position="alibi" if c.get("alibi") else "rope"))
    ffn = whole("intermediate_size", "ffn_hidden_size")
    shape = ModelShape(name, vocab, hidden, layers, heads, kv, ffn, tied=tied, mlp=mlp,
                       norm="layer" if kind == "nemotron" else "rms",
                       head_dim=int(c.get("head_dim") or 0) if c.get("head_dim") not in (None, hidden // heads) else 0,
                       qkv_bias=bool(c.get("attention_bias") or kind.startswith("qwen2")),
                       bias=bool(c.get("mlp_bias", False)))
    experts = whole("num_local_experts", "n_routed_experts", "num_experts", default=0)
    if experts:
        shape = replace(shape, experts=experts, top_k=whole("num_experts_per_tok", "moe_topk"),
                        expert_ffn=whole("moe_intermediate_size", default=ffn),
                        shared_experts=whole("n_shared_experts", default=0),
                        dense_layers=whole("first_k_dense_replace", default=0),
                        router_bias=kind == "deepseek_v3")
    if c.get("kv_lora_rank"):
        shape = replace(shape, q_lora_rank=whole("q_lora_rank", default=0), kv_lora_rank=whole("kv_lora_rank"),
                        qk_rope_dim=whole("qk_rope_head_dim"), qk_nope_dim=whole("qk_nope_head_dim"),
                        v_head_dim=whole("v_head_dim"))
    return validate(shape)


def load(name_or_path: str) -> ModelShape:
    """A preset by name, or a Hugging Face ``config.json`` by path (a ``ValueError`` in one line
    otherwise)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ValueError(f"--model {name_or_path}: no such file; give a preset ({', '.join(PRESETS)}) "
                             "or the path of a Hugging Face config.json")
        try:
            config = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"--model {name_or_path}: not a JSON file ({e})") from None
        return from_hf_config(config, path.name)
    raise ValueError(f"--model {name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json path")


def config_of(name_or_path: str) -> dict | None:
    """The Hugging Face ``config.json`` behind ``--model`` (``None`` for a preset or ``custom``), read
    as :func:`load` reads it."""
    if name_or_path in PRESETS or name_or_path == "custom" or not Path(name_or_path).is_file():
        return None
    try:
        config = json.loads(Path(name_or_path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) else None


# --- layers the planner does not time ------------------------------------------------------------------------

# what a ``layer_types`` entry (Gemma 2/3, Qwen3-Next, GPT-OSS, Kimi Linear ...) names, as the planner times it
SOFTMAX_LAYER_TYPES = ("full_attention", "attention", "global_attention", "global")
SSM_KEYS = ("mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_heads", "mamba_head_dim", "ssm_state_size",
            "state_size", "d_state", "conv_kernel", "ssm_cfg", "time_step_rank")


def unmodelled_layers(config: dict, seq_len: int | None = None, name: str = "config.json") -> list[str]:
    """Layers of a Hugging Face ``config`` the planner cannot time, one line each naming the kind and
    the key it was read from: linear attention (``layer_types``, MiniMax's ``attn_type_list``, Kimi
    Linear's ``linear_attn_config``), state-space (Mamba) layers (``mamba_*``/``ssm_*`` keys,
    Nemotron-H's ``hybrid_override_pattern``, Jamba's ``attn_layer_period``), and sliding-window or
    chunked attention where the sequence (``seq_len``, when given) is longer than the window. The
    planner times every layer as softmax attention over the whole sequence, so its answer for such
    a model is an estimate of a model it is not; an empty list when there is nothing to say."""
    c = {k: v for k, v in config.items() if v is not None}
    layers = c.get("num_hidden_layers") or c.get("n_layer") or c.get("num_layers")
    of = f" of {layers}" if isinstance(layers, int) else ""
    timed = "which the planner times as softmax attention over the whole sequence"
    lines = []
    window = c.get("sliding_window") if c.get("use_sliding_window", True) is not False else None
    longer = isinstance(window, int) and (seq_len is None or seq_len > window)
    types = c.get("layer_types")
    if isinstance(types, list):
        counts: dict[str, int] = {}
        for kind in types:
            if str(kind) not in SOFTMAX_LAYER_TYPES:
                counts[str(kind)] = counts.get(str(kind), 0) + 1
        for kind, n in counts.items():
            if "sliding" in kind and not longer:
                continue  # a window at least as long as the sequence attends to all of it
            detail = f" (a window of {window} tokens)" if "sliding" in kind and isinstance(window, int) else ""
            lines.append(f"{name}: {n} of {len(types)} layers are {kind.replace('_', ' ')}{detail} (layer_types), {timed}")
    elif longer:
        lines.append(f"{name}: sliding-window attention of {window} tokens (sliding_window), {timed}")
    if isinstance(c.get("attn_type_list"), list):
        linear = sum(1 for x in c["attn_type_list"] if x == 0)
        if linear:
            lines.append(f"{name}: {linear} of {len(c['attn_type_list'])} layers are linear (lightning) attention "
                         f"(attn_type_list 0), {timed}")
    if isinstance(c.get("linear_attn_config"), dict):
        kda = c["linear_attn_config"].get("kda_layers")
        count = f"{len(kda)}{of} layers are" if isinstance(kda, list) else "some layers are"
        lines.append(f"{name}: {count} linear attention (linear_attn_config), {timed}")
    pattern = c.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:
        lines.append(f"{name}: {pattern.count('M')} of {len(pattern)} layers are Mamba (state-space) layers "
                     f"(hybrid_override_pattern 'M'), {timed}")
    elif isinstance(c.get("attn_layer_period"), int) and isinstance(layers, int):
        mamba = layers - layers // max(1, c["attn_layer_period"])
        lines.append(f"{name}: {mamba}{of} layers are Mamba (state-space) layers (attn_layer_period "
                     f"{c['attn_layer_period']}), {timed}")
    elif any(k in c for k in SSM_KEYS) or any(x in str(c.get("model_type", "")) for x in ("mamba", "ssm")):
        found = next((k for k in SSM_KEYS if k in c), "model_type")
        lines.append(f"{name}: state-space (Mamba) layers ({found}), {timed}")
    chunk = c.get("attention_chunk_size")
    if isinstance(chunk, int) and (seq_len is None or seq_len > chunk):
        lines.append(f"{name}: chunked attention of {chunk} tokens (attention_chunk_size), {timed}")
    return lines


def validate(shape: ModelShape) -> ModelShape:
    """``shape`` itself, or a ``ValueError`` naming the first impossible size."""
    if shape.mlp not in MLPS:
        raise ValueError(f"{shape.name}: MLP {shape.mlp!r} is not one of {', '.join(MLPS)}")
    for field in ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn"):
        if getattr(shape, field) < 1:
            raise ValueError(f"{shape.name}: {field} must be at least 1, got {getattr(shape, field)}")
    if not shape.mla and not shape.head_dim and shape.hidden % shape.heads:
        raise ValueError(f"{shape.name}: hidden size {shape.hidden} is not divisible by {shape.heads} heads")
    if shape.heads % shape.kv_heads:
        raise ValueError(f"{shape.name}: {shape.heads} heads are not a multiple of {shape.kv_heads} key/value heads")
    if shape.moe and not 0 < shape.top_k <= shape.experts:
        raise ValueError(f"{shape.name}: top_k {shape.top_k} must be between 1 and the {shape.experts} experts")
    return shape


def custom(name: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, **kw) -> ModelShape:
    """A shape from flags (``--hidden`` etc.): a Llama-style block unless told otherwise."""
    return validate(ModelShape(name, vocab, hidden, layers, heads, kv_heads, ffn, **kw))


def to_json(shape: ModelShape) -> dict:
    return asdict(shape)
