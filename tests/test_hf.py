"""Hugging Face in and out (ppbook.hf; chapters 4 and 7). In one process: the name mapping and
the rotary row order both ways, configs, the book's Llama against transformers' on the same
files (p = 1 is one process), sharded and tied folders, the Chain, bad folders refused in one
line. Under torchrun: transformers' model through the pipeline at 2 and 3 stages, the book's
stages from Hugging Face files at p = 2 and 3, the model traced as transformers builds it failing
at 3 stages, and Hugging Face -> pipeline -> train -> Hugging Face on a tied model, against
transformers' own model trained in this process.

Nothing is downloaded: every model is built from a small config with random weights."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only, never the network

import pytest
import torch
import transformers  # pinned (requirements-reader.txt): a CI without it fails here, it does not skip

from conftest import assert_one_line_error
from ppbook import checkpoint as ckpt
from ppbook import hf, launch, workload
from ppbook.models import Llama, LlamaConfig, apply_rope, build_model
from ppbook.stages import assign_layers, stage_module

transformers.utils.logging.disable_progress_bar()
CFG = LlamaConfig(vocab_size=96, dim=32, n_layers=5, n_heads=4, n_kv_heads=2, ffn_hidden_dim=48, max_seq_len=16)
#: Llama 3.1's rotary scaling (its config.json has factor 8, 1, 4 and 8192), with an original
#: context within the small models' positions, so that the scaling moves their frequencies
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}


def hf_llama(cfg: LlamaConfig = CFG, seed: int = 0, **overrides) -> "transformers.LlamaForCausalLM":
    """transformers' Llama of ``cfg``, random, with norm scales that are not all one."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**hf.config_to_hf(cfg), **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Hugging Face folder written by transformers itself (save_pretrained)."""
    path = tmp_path_factory.mktemp("hf-llama")
    hf_llama().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tied_folder(tmp_path_factory):
    """The same, of a model whose head is its embedding matrix (tie_word_embeddings), with Llama
    3.1's rotary scaling: a Llama 3.2 1B in small."""
    path = tmp_path_factory.mktemp("hf-llama-tied")
    hf_llama(seed=1, tie_word_embeddings=True, rope_scaling=LLAMA3).save_pretrained(path)
    return path


def tokens(cfg: LlamaConfig = CFG, batch: int = 2):
    return torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len), generator=torch.Generator().manual_seed(3))


# --- the mapping, both ways ---------------------------------------------------------------------
def test_every_name_maps_both_ways_onto_transformers_own_names():
    book = hf.full_names(CFG)
    assert sorted(book) == sorted(Llama(CFG).state_dict())
    with torch.device("meta"):
        theirs = set(transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf.config_to_hf(CFG))).state_dict())
    assert {hf.to_hf_name(n) for n in book} == theirs
    assert all(hf.from_hf_name(hf.to_hf_name(n)) == n for n in book)
    assert all(hf.to_hf_name(hf.from_hf_name(n)) == n for n in theirs)
    with pytest.raises(KeyError, match="not a Hugging Face Llama tensor name"):
        hf.from_hf_name("model.layers.0.self_attn.rotary_emb.inv_freq")


@pytest.mark.parametrize("n_heads,head_dim", [(1, 2), (4, 8), (2, 16)])
def test_rotary_rows_reorder_within_heads_and_back(n_heads, head_dim):
    w = torch.arange(n_heads * head_dim * 3, dtype=torch.float64).reshape(n_heads * head_dim, 3)
    to = hf.rope_to_hf(w, n_heads)
    assert torch.equal(hf.rope_from_hf(to, n_heads), w) and torch.equal(hf.rope_to_hf(hf.rope_from_hf(w, n_heads), n_heads), w)
    half = head_dim // 2
    for h in range(n_heads):  # head h's rows stay in head h: neighbours (2i, 2i+1) become (i, i + hd/2)
        rows = w[h * head_dim:(h + 1) * head_dim]
        assert torch.equal(to[h * head_dim:h * head_dim + half], rows[0::2])
        assert torch.equal(to[h * head_dim + half:(h + 1) * head_dim], rows[1::2])


def test_reordered_rows_turn_the_books_rotation_into_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    hd, model = CFG.dim // CFG.n_heads, Llama(CFG)
    x, w = torch.randn(1, CFG.max_seq_len, CFG.dim), torch.randn(CFG.dim, CFG.dim)
    cos, sin = model.rope_cos, model.rope_sin  # (T, hd/2)

    def heads(y):
        return y.view(1, -1, CFG.n_heads, hd).transpose(1, 2)  # (1, H, T, hd)

    ours = apply_rope(heads(x @ w.T), cos, sin)  # rotates the pairs (2i, 2i+1)
    q = heads(x @ hf.rope_to_hf(w, CFG.n_heads).T)
    theirs, _ = apply_rotary_pos_emb(q, q, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    # transformers rotates the pairs (i, i + hd/2): the same vectors, their dimensions in the halves order
    torch.testing.assert_close(theirs, torch.cat([ours[..., 0::2], ours[..., 1::2]], -1))


def test_config_round_trip_and_refusals():
    d = transformers.LlamaConfig(**hf.config_to_hf(CFG)).to_dict()  # as transformers writes it
    assert hf.config_from_hf(d) == (CFG, False)
    assert hf.rope_params(d) == {"rope_type": "default", "rope_theta": CFG.rope_theta}
    assert hf.config_from_hf({**d, "tie_word_embeddings": True})[1] is True
    cfg31 = LlamaConfig(**{**CFG.__dict__, "rope_theta": 5e5})
    scaled = transformers.LlamaConfig(**hf.config_to_hf(cfg31, rope=LLAMA3)).to_dict()
    assert hf.rope_params(scaled) == {**LLAMA3, "rope_theta": 5e5}  # written as transformers reads it
    assert hf.config_from_hf(scaled) == (cfg31, False)
    old_style = {**hf.config_to_hf(CFG), "rope_theta": 5e5, "rope_scaling": {**LLAMA3, "type": "llama3"}}
    old_style["rope_scaling"].pop("rope_type")  # the oldest files say "type"
    assert hf.rope_params(old_style) == {**LLAMA3, "rope_theta": 5e5}
    for change, message in [({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5}}, "rope_type 'yarn'"),
                            ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
                             "rope_type 'llama3' without low_freq_factor, high_freq_factor, original_max"),
                            ({"attention_bias": True}, "biases"), ({"head_dim": 4}, "head_dim 4"),
                            ({"model_type": "mistral"}, "model_type 'mistral'")]:
        with pytest.raises(ValueError, match=message):
            hf.config_from_hf({**d, **change})


# --- the rotary tables: as transformers computes them, Llama 3.1's scaling included ---------------
LONG_LLAMA3 = {**LLAMA3, "original_max_position_embeddings": 256}  # for 2048 positions


@pytest.mark.parametrize("rope", [None, LONG_LLAMA3], ids=["default", "llama3"])
def test_rotary_tables_equal_transformers_bitwise_at_head_size_128_and_2048_positions(rope):
    cfg = LlamaConfig(vocab_size=8, dim=256, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden_dim=8,
                      max_seq_len=2048, rope_theta=5e5)
    d = hf.config_to_hf(cfg, rope=rope)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig(**d))
    cos, sin = rotary(torch.zeros(1), torch.arange(cfg.max_seq_len)[None])  # (1, T, hd): the halves twice
    ours = hf.hf_rope_tables(hf.rope_params(d), 128, cfg.max_seq_len)  # (T, hd/2)
    assert torch.equal(cos[0, :, :64], ours[0]) and torch.equal(sin[0, :, :64], ours[1])
    if rope is not None:  # the scaling moved the long wavelengths: the plain tables are not these
        plain = hf.hf_rope_tables({"rope_type": "default", "rope_theta": cfg.rope_theta}, 128, cfg.max_seq_len)
        assert (plain[0] - ours[0]).abs().max() > 0.5


def sharp_llama_folder(path, cfg: LlamaConfig, rope: dict | None):
    """transformers' Llama of ``cfg`` with weights of a trained model's scale (unit-variance
    products, sharper query and key): its attention depends on position, so the rotary tables
    show in the logits (transformers' 0.02 initialisation leaves attention nearly uniform)."""
    model = hf_llama(cfg, seed=2, **({} if rope is None else {"rope_scaling": rope}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0, p.shape[1] ** -0.5 * (3 if name.endswith(("q_proj.weight", "k_proj.weight")) else 1))
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("rope", [None, LONG_LLAMA3], ids=["default", "llama3"])
def test_book_logits_within_transformers_own_rounding_at_head_size_128_and_2048_positions(rope, tmp_path):
    """Item 9 of issue 40: a real head size and a long sequence, where the book's float64 tables
    drift from transformers' float32 ones. The yardstick is transformers' own rounding (float32
    against float64); the book's own tables, and for Llama 3.1 the unscaled ones, fail it."""
    from ppbook.models import rope_tables

    cfg = LlamaConfig(vocab_size=64, dim=256, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden_dim=64,
                      max_seq_len=2048, rope_theta=5e5)
    theirs = sharp_llama_folder(tmp_path, cfg, rope)
    x = torch.randint(0, cfg.vocab_size, (1, cfg.max_seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, logits64 = theirs(x).logits, transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)(x).logits
        bound = hf.rounding_bound(logits, logits64)
        stage = hf.load_stage(tmp_path)
        assert (stage(x) - logits).abs().max() <= bound
        wrong = [rope_tables(128, cfg.max_seq_len, cfg.rope_theta)]  # float64 angles, rounded once
        if rope is not None:
            wrong.append(hf.hf_rope_tables({"rope_type": "default", "rope_theta": cfg.rope_theta}, 128, cfg.max_seq_len))
        for cos, sin in wrong:  # the check can fail: these tables give logits beyond the bound
            stage.rope_cos.copy_(cos), stage.rope_sin.copy_(sin)
            assert (stage(x) - logits).abs().max() > 2 * bound


def test_a_llama31_folder_into_stages_gives_transformers_logits(tmp_path):
    model = hf_llama(seed=3, rope_scaling=LLAMA3)
    model.save_pretrained(tmp_path)
    x = tokens()
    with torch.no_grad():
        expected = model(x).logits
        for p in (1, 3):
            h = x
            for s in range(p):
                h = hf.load_stage(tmp_path, s, p)(h)
            torch.testing.assert_close(h, expected, rtol=0, atol=hf.TOLERANCE)


# --- weights in and out, in one process ---------------------------------------------------------
def test_transformers_files_into_stages_at_any_size_give_transformers_logits(folder):
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    x = tokens()
    with torch.no_grad():
        expected = model(x).logits
        for p in (1, 5):  # one process is p = 1; 2 and 3 under torchrun below, and in chapter 4
            h = x
            for s in range(p):
                h = hf.load_stage(folder, s, p)(h)
            torch.testing.assert_close(h, expected, rtol=0, atol=hf.TOLERANCE)


def own_tensors(names, stage_index: int, num_stages: int) -> set[str]:
    """The Hugging Face tensors a stage holds, from the names alone: its layers' (the book's
    split), the embedding on the first stage, the final norm and the head on the last."""
    layers = assign_layers(CFG.n_layers, num_stages)[stage_index]

    def owner_is_me(name: str) -> bool:
        if name.startswith("model.layers."):
            return int(name.split(".")[2]) in layers
        return stage_index == 0 if name == "model.embed_tokens.weight" else stage_index == num_stages - 1

    return {n for n in names if owner_is_me(n)}


def test_each_stage_reads_only_its_own_tensors_measured_at_safetensors(folder, tmp_path, monkeypatch):
    """Lazy loading measured, not inferred from the names a stage wants: safetensors' safe_open
    is wrapped here (independently of hf.record_reads), and every tensor it serves is noted."""
    import safetensors

    real, opened, served = safetensors.safe_open, [], []

    class Spy:
        def __init__(self, filename, *args, **kwargs):
            self.f, self.file = real(filename, *args, **kwargs), os.path.basename(filename)
            opened.append(self.file)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):  # the header only
            return self.f.keys()

        def get_tensor(self, name):
            served.append((self.file, name))
            return self.f.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)  # no other method: another way to read would fail
    sharded = tmp_path / "sharded"
    hf_llama().save_pretrained(sharded, max_shard_size="20KB")
    for path in (folder, sharded):
        files = {n: f.name for n, f in hf.weight_files(path).items()}  # the index, or one file's header
        for p in (1, 2, 3, 5):
            everything = []
            for s in range(p):
                opened.clear(), served.clear()
                with hf.record_reads() as reported:
                    hf.load_stage(path, s, p)
                mine = own_tensors(files, s, p)
                names = [name for _, name in served]
                assert sorted(names) == sorted(mine), (path.name, p, s)  # its own tensors, each once
                assert served == [(files[n], n) for _, n in served]  # each from the file that holds it
                if len(set(files.values())) > 1:  # shards: a stage opens only those holding its tensors
                    assert set(opened) == {files[n] for n in mine}, (p, s)
                assert [(r.file, r.tensor) for r in reported] == served  # record_reads reports the same
                assert all(r.bytes > 0 for r in reported)
                everything += names
            assert sorted(everything) == sorted(files)  # together, the stages read the whole folder once


def test_books_weights_out_and_back_in_bitwise_and_transformers_agrees(tmp_path):
    book = build_model(CFG, seed=4)
    hf.save(book.state_dict(), CFG, tmp_path)
    back = hf.load_stage(tmp_path)
    assert all(torch.equal(t, book.state_dict()[n]) for n, t in back.state_dict().items())
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens()).logits, book(tokens()), rtol=0, atol=hf.TOLERANCE)
    with pytest.raises(ValueError, match="pass a model's, not a stage's"):
        hf.save(stage_module(build_model(CFG), 0, 2).state_dict(), CFG, tmp_path / "stage")


def test_sharded_and_tied_folders(tmp_path):
    sharded, tied = tmp_path / "sharded", tmp_path / "tied"
    hf_llama().save_pretrained(sharded, max_shard_size="20KB")
    assert len(set(hf.weight_files(sharded).values())) > 1  # an index and several files
    model = hf_llama(seed=1, tie_word_embeddings=True)
    model.save_pretrained(tied)
    assert "lm_head.weight" not in hf.weight_files(tied)  # a tied model stores its head once
    last = hf.load_stage(tied, 2, 3)
    assert torch.equal(last.output.weight, model.model.embed_tokens.weight)
    with torch.no_grad():
        for path, ref in ((sharded, transformers.LlamaForCausalLM.from_pretrained(sharded)), (tied, model)):
            torch.testing.assert_close(hf.load_stage(path)(tokens()), ref(tokens()).logits, rtol=0, atol=hf.TOLERANCE)


def test_a_tied_model_is_written_tied_and_only_when_its_copies_are_equal(tmp_path):
    book = build_model(CFG, seed=4)
    state = book.state_dict()
    state["output.weight"] = state["tok_embeddings.weight"].clone()  # two equal copies, as training keeps them
    hf.save(state, CFG, tmp_path / "tied", tied=True)
    assert json.loads((tmp_path / "tied" / "config.json").read_text())["tie_word_embeddings"] is True
    assert "lm_head.weight" not in hf.weight_files(tmp_path / "tied")  # stored once, as transformers does
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "tied")
    assert theirs.lm_head.weight is theirs.model.embed_tokens.weight
    book.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens()).logits, book(tokens()), rtol=0, atol=hf.TOLERANCE)
    state["output.weight"][0, 0] += 1e-3
    with pytest.raises(ValueError, match="the head differs from the embedding"):
        hf.save(state, CFG, tmp_path / "drifted", tied=True)
    book.load_state_dict(state)  # and without a process group, save_stages writes the whole model
    with pytest.raises(ValueError, match="the head differs from the embedding"):
        hf.save_stages(book, CFG, tmp_path / "drifted-stages", tied=True)
    hf.save_stages(book, CFG, tmp_path / "untied")
    assert set(hf.weight_files(tmp_path / "untied").values()) == {tmp_path / "untied" / "model-00001-of-00001.safetensors"}
    assert all(torch.equal(t, state[n]) for n, t in hf.load_stage(tmp_path / "untied").state_dict().items())


def test_a_dcp_checkpoint_exports_to_what_transformers_loads(tmp_path):
    # one process writes the whole model (the torchrun test below exports one written by 3 stages)
    full = build_model(CFG, seed=5)
    ckpt.save(tmp_path / "ckpt", 2, full, torch.optim.AdamW(full.parameters()), keep=1)
    out = hf.export(ckpt.step_dir(tmp_path / "ckpt", 2), tmp_path / "hf", CFG)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    with torch.no_grad():
        theirs = transformers.LlamaForCausalLM.from_pretrained(out)(tokens()).logits
        torch.testing.assert_close(theirs, full(tokens()), rtol=0, atol=hf.TOLERANCE)


# --- transformers' model as a chain ------------------------------------------------------------
def test_chain_stages_chained_equal_transformers_forward_bitwise():
    model = hf_llama()
    with torch.no_grad():
        expected, h = model(tokens()).logits, tokens()
        for s in range(3):
            h = hf.chain_stage(hf.Chain(hf_llama()), s, 3)(h)
    assert torch.equal(h, expected)


def test_chain_refuses_what_it_cannot_cut():
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        hf.Chain(hf_llama(attn_implementation="eager"))
    with pytest.raises(ValueError, match="ties its output head"):
        hf.chain_stage(hf.Chain(hf_llama(tie_word_embeddings=True)), 0, 2)


# --- under torchrun -----------------------------------------------------------------------------
@pytest.mark.torchrun
def test_transformers_llama_through_three_stages_and_book_stages_from_its_files():
    small = ["--dim", 32, "--seq-len", 16, "--hf-steps", 2]  # 5 layers: uneven on 3 stages
    r = launch.torchrun("04_splitting.py", ["--experiments", "hf", "hf-weights", "--check", *small], nproc=3, timeout=400)
    assert r.data["match"]
    for method in ("manual", "tracer"):
        run = r.data["hf"][method]
        assert run["match"] and run["layers_per_stage"] == assign_layers(5, 3), run
        assert max(s["max_weight_diff"] for s in run["stages"]) <= 1e-6
    w = r.data["hf_weights"]
    assert w["match"] is True and w["max_logit_diff"] <= w["tolerance"]
    assert hf.TOLERANCE <= w["tolerance"] < 1e-3  # transformers' own rounding, times ROUNDING_FACTOR
    script = launch.load_script("04_splitting.py")
    assert_each_rank_read_its_own(w, 3, script.config("llama", script.parse_args([str(a) for a in small])))


def assert_each_rank_read_its_own(w: dict, nproc: int, cfg: LlamaConfig) -> None:
    """The script's hf-weights result: what safetensors served each rank (hf.record_reads in the
    script) is that rank's own tensors, once, with their bytes (float32), and the ranks together
    read the whole folder."""
    with torch.device("meta"):
        size = {hf.to_hf_name(n): 4 * t.numel() for n, t in Llama(cfg).state_dict().items()}
    everything = sorted(size)
    assert w["n_layers"] == cfg.n_layers and len(w["stages"]) == nproc and w["tensors_in_folder"] == len(everything)
    for s, stage in enumerate(w["stages"]):
        assert sorted(stage["read"]) == sorted(own_tensors(everything, s, nproc)) == stage["wanted"], s
        assert stage["bytes_read"] == sum(size[n] for n in stage["read"]), s
    assert sorted(sum((s["read"] for s in w["stages"]), [])) == everything


def test_every_launch_runs_with_the_hub_switched_off(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # this module sets it: the launcher must on its own
    assert launch.child_env()["HF_HUB_OFFLINE"] == "1"


@pytest.mark.torchrun
def test_from_pretrained_and_book_stages_from_a_local_folder_offline(folder):
    """--hf-model: transformers' from_pretrained on a local folder (offline, as every launch:
    the test above), trained through the pipeline at 2 stages against one process; and the
    book's stages from the same folder (--hf-dir). One process is p = 1 above, in-process."""
    nproc = 2
    args = ["--experiments", "hf", "hf-weights", "--hf-model", folder, "--hf-dir", folder, "--hf-steps", 2,
            "--vocab", CFG.vocab_size, "--seq-len", CFG.max_seq_len, "--layers", CFG.n_layers, "--check"]
    r = launch.torchrun("04_splitting.py", args, nproc=nproc, timeout=300).data
    assert r["match"] and r["hf_weights"]["match"] is True
    assert_each_rank_read_its_own(r["hf_weights"], nproc, CFG)
    # the run started from the folder's weights, not from a random model: its first loss, in one
    # process and through the pipeline, is the loss of the model transformers loads from the folder
    script = launch.load_script("04_splitting.py")
    cli_args = script.parse_args([str(a) for a in args])
    x, y = workload.make_batch(cli_args, 0)
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        first = [workload.loss_fn(model(a).logits, b).item() for a, b in
                 zip(x.tensor_split(cli_args.microbatches), y.tensor_split(cli_args.microbatches))]
    for method, run in r["hf"].items():
        assert run["match"] and run["layers_per_stage"] == assign_layers(CFG.n_layers, nproc), method
        assert run["reference_losses"][0] == pytest.approx(sum(first) / len(first), abs=1e-6), method
        assert run["losses"][0] == pytest.approx(run["reference_losses"][0], abs=1e-6), method
        assert len(run["losses"]) == cli_args.hf_steps


@pytest.mark.torchrun
def test_transformers_model_traced_as_is_fails_at_three_stages_on_its_skip():
    r = launch.torchrun("04_splitting.py", ["--experiments", "hf-direct", "--layers", 3, "--dim", 32, "--seq-len", 8],
                        nproc=3, timeout=240, check=False, json_result=False)
    assert r.returncode != 0
    assert "rank 0 failed: PipeliningMetadataError: Backward of skip connections not supported yet" in r.output


@pytest.mark.torchrun
def test_hugging_face_to_pipeline_to_training_to_hugging_face_keeps_a_tied_head(tied_folder, tmp_path):
    """Round trip 3 on a tied folder with Llama 3.1's rotary scaling (a Llama 3.2 in small) at 3
    stages: the head's copy on stage 2 and the embedding on stage 0 add their gradients (a middle
    stage holds neither), and each rank writes its stage's file, tied and scaled again.
    (Chapter 7 runs an untied folder on 2.) The script's --check compares it with its own
    one-process run; here it is compared with transformers' tied model, one shared matrix,
    trained in this process from the same folder with the script's optimizer, schedule and batches."""
    out, steps = tmp_path / "hf-out", 2
    args = ["--from-hf", tied_folder, "--steps", steps, "--save-dir", tmp_path / "ckpt", "--save-every", steps,
            "--to-hf", out, "--check", "--seq-len", 16]
    r = launch.torchrun("07_checkpointing.py", args, nproc=3, timeout=300).data
    assert r["match"] and r["tied"] is True and r["layers_per_stage"] == assign_layers(CFG.n_layers, 3)
    script = launch.load_script("07_checkpointing.py")
    cli_args = script.parse_args([str(a) for a in args])
    cli_args.vocab, m = CFG.vocab_size, cli_args.microbatches  # the vocabulary validate() reads from config.json
    theirs = transformers.LlamaForCausalLM.from_pretrained(tied_folder)
    assert theirs.lm_head.weight is theirs.model.embed_tokens.weight
    optimizer, scheduler = script.make_optimizer(theirs, cli_args)
    for step in range(steps):
        x, y = workload.make_batch(cli_args, step)
        optimizer.zero_grad(set_to_none=True)
        losses = [workload.loss_fn(theirs(a).logits, b) for a, b in zip(x.tensor_split(m), y.tensor_split(m))]
        sum(losses).backward()
        workload.scale_grads(theirs, m)
        # step 1: the pipeline started from the folder's weights (not the seed's); step 2: after one
        # update, the tied matrix trained as one (each copy on its own differs here by about 4e-4)
        assert r["losses"][str(step + 1)] == pytest.approx(workload.mean_loss(losses), abs=hf.TOLERANCE), step
        optimizer.step()
        scheduler.step()
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and hf.rope_params(config) == hf.read_rope(tied_folder)  # Llama 3.1's
    files = hf.weight_files(out)  # each rank wrote its own stage's file (save_stages), rank 0 the index
    assert "lm_head.weight" not in files and len(set(files.values())) == 3
    assert {n for n, f in files.items() if f.name == "model-00002-of-00003.safetensors"} == own_tensors(files, 1, 3)
    trained = hf.load_stage(tied_folder)  # the folder's rotary tables, then the step's weights
    exported = ckpt.export(tmp_path / "ckpt" / f"step-{steps:06d}", tmp_path / "m.pt")
    trained.load_state_dict(torch.load(exported, weights_only=True), strict=True)
    written = hf.load_stage(out).state_dict()  # the files hold the trained weights, to the last bit
    assert written.keys() == trained.state_dict().keys()
    assert all(torch.equal(t, trained.state_dict()[n]) for n, t in written.items())
    back, start = transformers.LlamaForCausalLM.from_pretrained(out), transformers.LlamaForCausalLM.from_pretrained(tied_folder)
    with torch.no_grad():
        torch.testing.assert_close(back(tokens()).logits, trained(tokens()), rtol=0, atol=hf.TOLERANCE)
        torch.testing.assert_close(back(tokens()).logits, theirs(tokens()).logits, rtol=0, atol=hf.TOLERANCE)
        assert (back(tokens()).logits - start(tokens()).logits).abs().max() > 1e-3  # it trained


@pytest.mark.parametrize("script,args,message", [
    ("04_splitting.py", ["--experiments", "hf-weights", "--hf-dir", "/nonexistent"], "has no config.json"),
    ("07_checkpointing.py", ["--to-hf", "out", "--save-dir", "c", "--save-every", "2", "--steps", "4"],
     "--to-hf writes a Llama as a Hugging Face folder: add --model llama"),
])
def test_bad_input_one_line(script, args, message):
    assert_one_line_error(script, args, message)


def test_a_folder_without_safetensors_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(CFG)))
    torch.save(build_model(CFG).state_dict(), tmp_path / "pytorch_model.bin")  # what older folders hold
    convert = f"M.from_pretrained('{tmp_path}').save_pretrained('{tmp_path}')"
    fits = ["--seq-len", CFG.max_seq_len, "--vocab", CFG.vocab_size]  # the folder is the only problem
    for script, args in [("07_checkpointing.py", ["--from-hf", tmp_path, *fits]),
                         ("04_splitting.py", ["--experiments", "hf-weights", "--hf-dir", tmp_path, *fits])]:
        assert_one_line_error(script, args, f"{tmp_path} has pytorch_model.bin but no *.safetensors")
        assert_one_line_error(script, args, convert)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "a.safetensors"}}))
    assert_one_line_error("07_checkpointing.py", ["--from-hf", tmp_path, *fits], "lists 1 files, of which 1 are missing")


def test_a_model_that_is_neither_a_folder_nor_a_downloaded_hub_name_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as every launch has it
    for name, message in [("/nonexistent/model", "no such folder, and not a Hub name"),
                          (tmp_path, "has no config.json"),
                          ("ppbook-tests/never-downloaded", "not in the local cache, and HF_HUB_OFFLINE is set")]:
        assert_one_line_error("04_splitting.py", ["--experiments", "hf", "--hf-model", name], f"--hf-model {name}")
        assert_one_line_error("04_splitting.py", ["--experiments", "hf", "--hf-model", name], message)


def test_a_tied_model_split_by_hf_is_refused_in_one_line(tied_folder):
    for experiment in ("hf", "hf-direct"):  # both split it into stages
        args = ["--experiments", experiment, "--hf-model", tied_folder, "--vocab", CFG.vocab_size,
                "--seq-len", CFG.max_seq_len]
        assert_one_line_error("04_splitting.py", args, "ties its output head to its embedding")


def test_a_folder_the_books_llama_cannot_load_is_refused_in_one_line(tmp_path):
    scaled = {**hf.config_to_hf(CFG), "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}  # Qwen's long context
    (tmp_path / "config.json").write_text(json.dumps(scaled))
    assert_one_line_error("07_checkpointing.py", ["--from-hf", tmp_path], "rope_type 'yarn'")


def test_a_local_model_too_small_for_the_batch_is_refused_in_one_line(folder):
    assert_one_line_error("04_splitting.py", ["--experiments", "hf", "--hf-model", folder, "--vocab", 1000],
                          f"--hf-model {folder}: its model has a vocabulary of {CFG.vocab_size}")
