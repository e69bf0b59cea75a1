"""Hugging Face Llama models in and out of the book's pipelines.

Introduced in chapter 4 ("Splitting a model": a ``transformers`` model through the pipeline, and
published weights loaded into the book's Llama stages) and used in chapter 7 ("Checkpointing":
a pipeline's checkpoint written as Hugging Face safetensors, and a pipeline started from one).

The book's :class:`~ppbook.models.Llama` and ``transformers``' ``LlamaForCausalLM`` compute the
same function. Their tensors differ in two ways only:

* **names**: ``layers.3.attention.wq.weight`` is ``model.layers.3.self_attn.q_proj.weight``
  (:data:`NAMES`, :func:`to_hf_name`, :func:`from_hf_name`);
* **the rows of the query and key projections**: rotary embeddings rotate pairs of a head's
  dimensions. The book (like Meta's original Llama code) pairs neighbours ``(2i, 2i+1)``;
  ``transformers`` pairs the two halves, ``(i, i + head_dim/2)`` (its ``rotate_half``). Moving a
  checkpoint between them reorders the rows of ``wq`` and ``wk`` within each head
  (:func:`rope_to_hf`, :func:`rope_from_hf`); the attention scores, and so the model, are unchanged.

The rotary tables themselves are computed as transformers computes them (:func:`hf_rope_tables`:
float32, Llama 3.1's ``"llama3"`` frequency scaling included), so Llama 1 to 3.3 load. Out, each
rank writes its own stage's safetensors file (:func:`save_stages`); :func:`export` converts a
saved DCP checkpoint in one process.

Nothing here imports ``transformers``: reading and writing Hugging Face folders needs only
``safetensors`` (imported when used) and JSON. :func:`record_reads` notes every tensor safetensors
hands out, so that "each stage reads only its own tensors" is measured, not inferred. :class:`Chain` wraps a ``transformers`` model a
reader already has.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ppbook.models import Llama, LlamaConfig
from ppbook.stages import assign_layers, stage_module

#: (book name, Hugging Face name) of every tensor; ``{i}`` is a layer number.
NAMES = [
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("layers.{i}.attention.wq.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("layers.{i}.attention.wk.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("layers.{i}.attention.wv.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("layers.{i}.attention.wo.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("layers.{i}.feed_forward.w1.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("layers.{i}.feed_forward.w3.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("layers.{i}.feed_forward.w2.weight", "model.layers.{i}.mlp.down_proj.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
]
WEIGHTS, INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"

#: Largest logit difference accepted between the book's Llama and transformers' on the same
#: weights, for the book's small random models (width 64, at most 32 positions, transformers'
#: initialisation). :func:`load_stage` computes the rotary tables as transformers does (float32,
#: the same operations: :func:`hf_rope_tables`), so what remains is rounding: a few sums run in
#: another order, and transformers' RMSNorm runs in float32 whatever the model's dtype.
TOLERANCE = 1e-5

#: Rounding grows with the model (depth, sequence length, sharper attention), so for any other
#: model the yardstick is transformers' own rounding: its float32 logits against its float64
#: logits on the same weights. The book's may differ from transformers' by this many times that
#: (:func:`rounding_bound`; measured at 0.5 to 1.3 times at head size 128 and 2048 positions).
ROUNDING_FACTOR = 4

#: The rotary embeddings the book's Llama loads: plain (Llama 1 and 2, TinyLlama, Llama 3.0) and
#: Llama 3.1's frequency scaling (``"llama3"``: Llama 3.1, 3.2 and 3.3).
ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def rounding_bound(theirs: torch.Tensor, theirs64: torch.Tensor) -> float:
    """The largest logit difference accepted between the book's Llama and transformers' float32
    logits ``theirs``: :data:`ROUNDING_FACTOR` times their distance from transformers' float64
    logits ``theirs64`` on the same tokens and weights, and never below :data:`TOLERANCE`."""
    own = (theirs.double() - theirs64.double()).abs().max().item()
    return max(TOLERANCE, ROUNDING_FACTOR * own)


def require_libraries() -> None:
    """A ``ValueError`` in one line when ``transformers`` or ``safetensors`` is missing."""
    import importlib.util

    missing = [m for m in ("transformers", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"{' and '.join(missing)} not installed: pip install -r requirements-reader.txt "
                         f"(it pins transformers and safetensors)")


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


_TO_HF = [(_pattern(book), hf) for book, hf in NAMES]
_FROM_HF = [(_pattern(hf), book) for book, hf in NAMES]


def _rename(name: str, table, side: str) -> str:
    for pattern, template in table:
        if match := pattern.match(name):
            return template.format(**match.groupdict())
    raise KeyError(f"{name!r} is not a {side} Llama tensor name (ppbook.hf.NAMES lists them)")


def to_hf_name(name: str) -> str:
    """``layers.3.attention.wq.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    return _rename(name, _TO_HF, "book")


def from_hf_name(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``layers.3.attention.wq.weight``."""
    return _rename(name, _FROM_HF, "Hugging Face")


# [start-rope]
def rope_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a query or key projection (n_heads * hd, dim), from the
    book's pairs (2i, 2i+1) to transformers' pairs (i, i + hd/2)."""
    rows, cols = w.shape  # per head: rows 0, 2, 4, ... then rows 1, 3, 5, ...
    pairs = w.view(n_heads, rows // n_heads // 2, 2, cols)  # (heads, hd/2, pair, dim)
    return pairs.transpose(1, 2).reshape(rows, cols)


def rope_from_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse: transformers' halves back to the book's neighbours."""
    rows, cols = w.shape
    halves = w.view(n_heads, 2, rows // n_heads // 2, cols)  # (heads, half, hd/2, dim)
    return halves.transpose(1, 2).reshape(rows, cols)
# [end-rope]


def _heads(name: str, cfg: LlamaConfig) -> int | None:
    """How many heads' rows a tensor's rotary layout spans (None: not rotated)."""
    return cfg.n_heads if name.endswith("wq.weight") else cfg.n_kv_heads if name.endswith("wk.weight") else None


def tensor_to_hf(name: str, t: torch.Tensor, cfg: LlamaConfig) -> tuple[str, torch.Tensor]:
    """A book tensor as Hugging Face stores it: its name and, for wq/wk, its rows reordered."""
    heads = _heads(name, cfg)
    return to_hf_name(name), rope_to_hf(t, heads) if heads else t


# --- config.json ----------------------------------------------------------------------------
def config_to_hf(cfg: LlamaConfig, dtype: torch.dtype = torch.float32, tied: bool = False,
                 rope: dict | None = None) -> dict:
    """The ``config.json`` of a ``LlamaForCausalLM`` that computes what the book's Llama does
    (``tied``: its output head is its embedding matrix, stored once; ``rope``: the rotary
    parameters of the folder it came from, :func:`read_rope`, so that a Llama 3.1 stays one)."""
    scaling = None if rope is None or rope["rope_type"] == "default" else \
        {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_hidden_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.dim // cfg.n_heads,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": scaling, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": tied, "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def rope_params(d: dict) -> dict:
    """The rotary parameters of a Hugging Face ``config.json`` as transformers 5 holds them
    (``rope_parameters``: ``rope_type``, ``rope_theta`` and the type's own keys); older files
    write ``rope_theta`` apart and the scaling as ``rope_scaling`` (``type`` in the oldest)."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    rope["rope_type"] = rope.pop("rope_type", rope.pop("type", "default"))
    rope["rope_theta"] = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
    return rope


def config_from_hf(d: dict) -> tuple[LlamaConfig, bool]:
    """The book's config of a Hugging Face Llama ``config.json`` and whether its output head is
    tied to the embedding; a ``ValueError`` naming what the book's Llama does not implement.
    A Llama 3.1's scaled rotary frequencies are not in :class:`LlamaConfig`: :func:`load_stage`
    computes the tables from the folder (:func:`read_rope`, :func:`hf_rope_tables`)."""
    if d.get("model_type") != "llama":
        raise ValueError(f"config.json has model_type {d.get('model_type')!r}; the book's Llama loads 'llama' only")
    rope = rope_params(d)
    kind = rope["rope_type"]
    missing = [k for k in _LLAMA3_KEYS if k not in rope] if kind == "llama3" else []
    dim, heads = d["hidden_size"], d["num_attention_heads"]
    problems = [
        f"rope_type {kind!r} (the book's Llama loads {' and '.join(map(repr, ROPE_TYPES))})"
        if kind not in ROPE_TYPES else "",
        f"rope_type 'llama3' without {', '.join(missing)}" if missing else "",
        f"hidden_act {d.get('hidden_act')!r} (SwiGLU uses silu)" if d.get("hidden_act", "silu") != "silu" else "",
        "biases (attention_bias or mlp_bias)" if d.get("attention_bias") or d.get("mlp_bias") else "",
        f"head_dim {d['head_dim']} != hidden_size / num_attention_heads"
        if d.get("head_dim") not in (None, dim // heads) else "",
    ]
    if any(problems):
        raise ValueError("this Llama config has what the book's Llama does not implement: "
                         + "; ".join(p for p in problems if p) + "; use transformers' own model for it")
    cfg = LlamaConfig(vocab_size=d["vocab_size"], dim=dim, n_layers=d["num_hidden_layers"], n_heads=heads,
                      n_kv_heads=d.get("num_key_value_heads") or heads, ffn_hidden_dim=d["intermediate_size"],
                      max_seq_len=d["max_position_embeddings"], norm_eps=d.get("rms_norm_eps", 1e-6),
                      rope_theta=rope["rope_theta"])
    return cfg, bool(d.get("tie_word_embeddings", False))


def _config_json(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise ValueError(f"{folder} has no {CONFIG}: pass a folder saved by save_pretrained or downloaded "
                         f"from the Hugging Face Hub (with its *.safetensors)")
    return json.loads(path.read_text())


def read_config(folder: str | Path) -> tuple[LlamaConfig, bool]:
    """:func:`config_from_hf` of ``folder/config.json``."""
    return config_from_hf(_config_json(folder))


def read_rope(folder: str | Path) -> dict:
    """:func:`rope_params` of ``folder/config.json``."""
    return rope_params(_config_json(folder))


# [start-hf-rope]
def hf_rope_tables(rope: dict, head_dim: int, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (max_seq_len, head_dim/2) as transformers computes them, in float32 and with
    the same operations, so that the two agree to the bit at every position (the book's own
    tables, :func:`ppbook.models.rope_tables`, are float64 angles rounded once, and drift from
    these by about 1e-6 at 32 positions, 1e-4 at 2048). ``"llama3"``: Llama 3.1's scaling
    (transformers' ``_compute_llama3_parameters``): wavelengths longer than the original context
    divided by ``factor``, short ones kept, the band between interpolated."""
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    if rope["rope_type"] == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        context = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq  # (hd/2,) positions per turn
        scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
        smooth = (context / wavelen - low) / (high - low)  # 0 at the long end of the band, 1 at the short
        between = ~(wavelen < context / high) * ~(wavelen > context / low)
        inv_freq = torch.where(between, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    angles = torch.arange(max_seq_len, dtype=torch.float)[:, None] * inv_freq  # (T, hd/2)
    return angles.cos(), angles.sin()
# [end-hf-rope]


def read_folder(folder: str | Path) -> tuple[LlamaConfig, bool]:
    """:func:`read_config`, and a ``ValueError`` in one line unless the folder's weights are
    safetensors that :func:`load_stage` can read tensor by tensor: called before any process
    group, so that a folder of ``pytorch_model.bin`` is refused there, not in every rank."""
    found = read_config(folder)
    folder = Path(folder)
    if (folder / INDEX).is_file():
        shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        missing = [f for f in shards if not (folder / f).is_file()]
        if missing:
            raise ValueError(f"{folder}/{INDEX} lists {len(shards)} files, of which {len(missing)} are missing "
                             f"(e.g. {missing[0]}): download the folder again")
    elif not (folder / WEIGHTS).is_file():
        other = sorted(f.name for f in folder.glob("*.bin")) or ["no weights"]
        raise ValueError(f"{folder} has {', '.join(other)} but no *.safetensors (each rank reads only its own tensors "
                         f"from safetensors): convert it once with python -c \"from transformers import "
                         f"AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}')\"")
    return found


def hub_config(name: str) -> Path | None:
    """Where ``from_pretrained(name)`` finds its ``config.json`` without the network: a local
    folder's, or the Hugging Face cache's for a Hub name downloaded before; ``None`` for a Hub name
    that ``from_pretrained`` will download. A ``ValueError`` in one line for a path that is not a
    model's folder, and for a Hub name not in the cache while the Hub is switched off
    (``HF_HUB_OFFLINE=1``, which :func:`ppbook.launch.child_env` sets for every launch)."""
    import os

    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if Path(name).exists():
        if not Path(name, CONFIG).is_file():
            raise ValueError(f"{name} has no {CONFIG}: pass a folder saved by save_pretrained, or a Hub name (owner/name)")
        return Path(name, CONFIG)
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ValueError(f"{name}: no such folder, and not a Hub name (owner/name): pass a folder with a "
                         f"{CONFIG} (save_pretrained's), or a name such as TinyLlama/TinyLlama-1.1B-Chat-v1.0") from None
    cached = try_to_load_from_cache(name, CONFIG)
    if isinstance(cached, str):
        return Path(cached)
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        raise ValueError(f"{name} is a Hub name, not in the local cache, and HF_HUB_OFFLINE is set (the book's launcher "
                         f"sets it): download it first (hf download {name}), or run with plain torchrun and HF_HUB_OFFLINE unset")
    return None


# --- weights in -----------------------------------------------------------------------------
def weight_files(folder: str | Path) -> dict[str, Path]:
    """Which file of ``folder`` holds each Hugging Face tensor: one ``model.safetensors``, or the
    shards that ``model.safetensors.index.json`` lists (large models come in shards)."""
    from safetensors import safe_open

    folder = Path(folder)
    if (folder / INDEX).is_file():
        return {n: folder / f for n, f in json.loads((folder / INDEX).read_text())["weight_map"].items()}
    if not (folder / WEIGHTS).is_file():
        raise ValueError(f"{folder} has neither {WEIGHTS} nor {INDEX}")
    with safe_open(folder / WEIGHTS, framework="pt") as f:
        return {n: folder / WEIGHTS for n in f.keys()}


@dataclass(frozen=True)
class Read:
    """One tensor that safetensors handed out: the file it came from, its name, its bytes."""
    file: str
    tensor: str
    bytes: int


@contextmanager
def record_reads():
    """Record every tensor that safetensors reads while the block runs: a list of :class:`Read`.

    It measures what :func:`load_stage` claims, that a stage reads only its own tensors: it
    replaces ``safetensors.safe_open`` (which ``load_stage`` and :func:`weight_files` look up
    when called) by a wrapper that notes each ``get_tensor`` and each indexing of a
    ``get_slice``, the calls that copy a tensor's bytes out of the file. ``keys()`` reads only
    the header and is not counted. One process at a time: the replacement is process-wide."""
    import safetensors

    real, reads = safetensors.safe_open, []

    class _Sliced:
        def __init__(self, part, file, name):
            self._part, self._file, self._name = part, file, name

        def __getitem__(self, index):
            t = self._part[index]
            reads.append(Read(self._file, self._name, t.numel() * t.element_size()))
            return t

        def __getattr__(self, attr):  # get_shape, get_dtype: the header's
            return getattr(self._part, attr)

    class _Spy:
        def __init__(self, filename, *args, **kwargs):
            self._f, self._file = real(filename, *args, **kwargs), Path(filename).name

        def __enter__(self):
            self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def get_tensor(self, name):
            t = self._f.get_tensor(name)
            reads.append(Read(self._file, name, t.numel() * t.element_size()))
            return t

        def get_slice(self, name):
            return _Sliced(self._f.get_slice(name), self._file, name)

        def __getattr__(self, attr):  # keys, metadata: the header's
            return getattr(self._f, attr)

    safetensors.safe_open = _Spy
    try:
        yield reads
    finally:
        safetensors.safe_open = real


def sources(names, tied: bool) -> dict[str, str]:
    """The Hugging Face tensor each of a stage's tensors (book ``names``) is read from. A tied
    model stores no ``lm_head.weight``: its head reads the embedding."""
    return {n: "model.embed_tokens.weight" if tied and n == "output.weight" else to_hf_name(n) for n in names}


# [start-load]
@torch.no_grad()
def load_stage(folder: str | Path, stage_index: int = 0, num_stages: int = 1,
               layers: list[int] | None = None, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> Llama:
    """Stage ``stage_index`` of ``num_stages`` of the book's Llama with the
    weights of a Hugging Face folder, reading only this stage's tensors.
    A tied folder's head is a copy of its embedding: training must add
    the two copies' gradients (chapter 7's add_tied_grads)."""
    from safetensors import safe_open

    cfg, tied = read_folder(folder)
    with torch.device("meta"):  # shapes only: the full model never exists
        model = Llama(cfg)
    stage_module(model, stage_index, num_stages, layers).to_empty(device="cpu")
    files, wanted = weight_files(folder), sources(model.state_dict(), tied)
    state = {}
    for file in sorted({files[hf_name] for hf_name in wanted.values()}):
        with safe_open(file, framework="pt") as f:  # lazy: reads a tensor when asked
            for name, hf_name in wanted.items():
                if files[hf_name] == file:
                    t, heads = f.get_tensor(hf_name), _heads(name, cfg)
                    state[name] = rope_from_hf(t, heads) if heads else t
    model.load_state_dict(state, strict=True)
    # to_empty left the rotary tables empty: fill them as transformers does
    head_dim = cfg.dim // cfg.n_heads
    cos, sin = hf_rope_tables(read_rope(folder), head_dim, cfg.max_seq_len)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    return model.to(dtype).to(device)
# [end-load]


# --- weights out ----------------------------------------------------------------------------
_TIED_DIFFER = "tied=True, but the head differs from the embedding: were the two copies' gradients added each step?"


def _to_hf_tensors(state_dict, cfg: LlamaConfig, dtype, tied: bool) -> dict[str, torch.Tensor]:
    """The book's tensors under transformers' names and rotary rows, in ``dtype``; a tied head
    is left out (stored once, as the embedding)."""
    return {hf_name: t.to(dtype or t.dtype).contiguous()
            for hf_name, t in (tensor_to_hf(name, t.detach(), cfg) for name, t in state_dict.items()
                               if not (tied and name == "output.weight"))}


def save(state_dict: dict[str, torch.Tensor], cfg: LlamaConfig, folder: str | Path,
         dtype: torch.dtype | None = None, tied: bool = False, rope: dict | None = None) -> Path:
    """Write the book's full-model ``state_dict`` as a Hugging Face folder, in one process:
    model.safetensors (transformers' names and rotary rows) and config.json. ``tied``: the head
    equals the embedding and is stored once, as transformers stores a tied model; ``rope``: the
    rotary parameters of the folder the model came from (:func:`read_rope`)."""
    from safetensors.torch import save_file

    missing = sorted(set(full_names(cfg)) - set(state_dict))
    if missing:
        raise ValueError(f"the state dict lacks {len(missing)} tensors of the full model (e.g. {missing[0]}): "
                         f"pass a model's, not a stage's (save_stages writes one file per stage)")
    if tied and not torch.equal(state_dict["output.weight"], state_dict["tok_embeddings.weight"]):
        raise ValueError(_TIED_DIFFER)  # the two copies trained as one matrix: equal to the last bit
    out = {n: t.cpu() for n, t in _to_hf_tensors(state_dict, cfg, dtype, tied).items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(out, folder / WEIGHTS, metadata={"format": "pt"})  # as transformers saves
    config = config_to_hf(cfg, dtype or next(iter(out.values())).dtype, tied, rope)
    (folder / CONFIG).write_text(json.dumps(config, indent=1))
    return folder


def _fingerprint(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


# [start-save-stages]
def save_stages(stage: nn.Module, cfg: LlamaConfig, folder: str | Path,
                dtype: torch.dtype | None = None, tied: bool = False,
                rope: dict | None = None) -> Path:
    """Every rank writes its own stage as one safetensors file of a Hugging
    Face folder, in parallel (torch's HuggingFaceStorageWriter under
    dcp.save): file r+1 of p holds rank r's tensors, and rank 0 writes the
    index naming each tensor's file and config.json. Nothing is gathered, no
    optimizer state is read: each rank needs only its stage's memory. Call
    it on every rank (it is a collective); without a process group the
    stage is the whole model, in one file."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    state = _to_hf_tensors(stage.state_dict(), cfg, dtype, tied)
    copies = {n: _fingerprint(t) for n, t in stage.state_dict().items()
              if tied and n in ("tok_embeddings.weight", "output.weight")}
    everyone = [(sorted(state), copies)]  # which tensors each rank writes
    if dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (sorted(state), copies))  # comm
    if tied and len({f for _, c in everyone for f in c.values()}) != 1:
        raise ValueError(_TIED_DIFFER)  # on every rank: each saw the same fingerprints
    file_of = {name: r + 1 for r, (names, _) in enumerate(everyone) for name in names}
    folder = Path(folder)
    if not dist.is_initialized() or dist.get_rank() == 0:  # before dcp.save returns
        folder.mkdir(parents=True, exist_ok=True)
        dtype = dtype or next(iter(state.values())).dtype
        config = config_to_hf(cfg, dtype, tied, rope)
        (folder / CONFIG).write_text(json.dumps(config, indent=1))
    writer = HuggingFaceStorageWriter(str(folder), fqn_to_index_mapping=file_of)
    dcp.save(state, storage_writer=writer)
    return folder
# [end-save-stages]


def full_names(cfg: LlamaConfig) -> list[str]:
    """Every tensor name of the book's full Llama of ``cfg`` (the persistent state dict)."""
    return [book.format(i=i) for book, _ in NAMES for i in (range(cfg.n_layers) if "{i}" in book else [0])]


def export(checkpoint: str | Path, folder: str | Path, cfg: LlamaConfig,
           dtype: torch.dtype | None = None, tied: bool = False, rope: dict | None = None) -> Path:
    """A pipeline's DCP checkpoint (any number of stages) as a Hugging Face folder that
    ``LlamaForCausalLM.from_pretrained`` loads, in one process. It reads the model's tensors
    only (not the optimizer's two Adam moments, twice the model's size), but all of them: one
    process holds the whole model once. Too large for that, write the folder from the stages
    themselves (:func:`save_stages`, as chapter 7's ``--to-hf`` does)."""
    import torch.distributed.checkpoint as dcp

    from ppbook import checkpoint as ckpt

    ckpt.verify(checkpoint)
    with torch.device("meta"):
        model = Llama(cfg)
    state = {"model": model.to_empty(device="cpu").state_dict()}  # the checkpoint's "model.*" keys
    dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)  # in place, tensor by tensor
    return save(state["model"], cfg, folder, dtype, tied, rope)


# --- a transformers model as a chain --------------------------------------------------------
# [start-chain]
class Chain(nn.Module):
    """transformers' LlamaForCausalLM as a chain that a split can cut:
    embedding, layers, norm, head, with transformers' tensor names."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        if hf_model.config._attn_implementation != "sdpa":
            raise ValueError("Chain passes no attention mask and relies on sdpa's causal flag: "
                             "load the model with attn_implementation='sdpa'")
        inner = self.model = nn.Module()  # same names: model.layers.3...
        inner.embed_tokens, inner.norm = hf_model.model.embed_tokens, hf_model.model.norm
        inner.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(hf_model.model.layers)})
        inner.rotary_emb, self.lm_head = hf_model.model.rotary_emb, hf_model.lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        inner = self.model
        h = inner.embed_tokens(h) if inner.embed_tokens is not None else h  # (B, T, C)
        for layer in inner.layers.values():
            positions = torch.arange(h.shape[1], device=h.device)[None]  # (1, T)
            # each layer's rotary tables from its own input: no stage needs another's
            h = layer(h, position_embeddings=inner.rotary_emb(h, positions))
        h = inner.norm(h) if inner.norm is not None else h
        return self.lm_head(h) if self.lm_head is not None else h  # (B, T, vocab)
# [end-chain]


def chain_stage(chain: Chain, stage_index: int, num_stages: int, layers: list[int] | None = None) -> Chain:
    """Cut a :class:`Chain`, in place, into stage ``stage_index`` of ``num_stages`` (layers keep
    their names), as :func:`ppbook.stages.stage_module` cuts the book's models."""
    if num_stages > 1 and chain.lm_head.weight is chain.model.embed_tokens.weight:
        raise ValueError("this model ties its output head to its embedding: split, they become two copies "
                         "(chapter 4, tied weights); untie it (tie_word_embeddings=False) or sum their gradients")
    if layers is None:
        layers = assign_layers(len(chain.model.layers), num_stages)[stage_index]
    for name in list(chain.model.layers):
        if int(name) not in layers:
            del chain.model.layers[name]
    if stage_index > 0:
        chain.model.embed_tokens = None
    if stage_index < num_stages - 1:
        chain.model.norm = chain.lm_head = None
    return chain


def stage_sources(pipe) -> list[list[int | None]]:
    """For each stage of a traced ``Pipe``, which stage each of its inputs comes from (``None``:
    the model's own input). A chain has ``[[None], [0], [1], ...]``; a larger gap is a skip."""
    stage_of, out = {}, []
    for node in pipe.split_gm.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith("submod_"):
            stage_of[node] = len(out)
            # an input is a placeholder, or item k of an earlier stage's outputs (getitem)
            out.append([stage_of.get(a.args[0] if a.op == "call_function" else a) for a in node.args])
    return out
