"""Text data for training the Llama model: a corpus shipped with the book, a BPE tokenizer
trained on it locally, padded fixed-length rows, and a batch iterator whose position is state.

Introduced in chapter 6 ("A real training loop"); chapter 7 saves and restores the iterator's
state with the model's.

The default needs no network. The corpus is *The Devil's Dictionary* by Ambrose Bierce
(1911, public domain: "A Public Domain Text, Copyright Expired"), taken from Debian's
``dict-devil`` package (``src/ppbook/corpus/README.md`` says how). A byte-level BPE tokenizer
is trained on it with the ``tokenizers`` library the first time it is needed and cached as a
Hugging Face ``tokenizer.json`` under the cache folder, keyed on the corpus and the vocabulary
size.

The real path of the MachineLearningMastery seed (a Hugging Face tokenizer file and a
``datasets`` dataset by name) is behind flags: ``--tokenizer-file`` takes any
``tokenizer.json`` (also the cached local one), ``--dataset`` a dataset name for
``datasets.load_dataset`` (which downloads it; not run by the book or its tests).

Padding as in the seed: every document ends with an end-of-text token and is cut into rows of
``seq_len + 1`` tokens; the last row of a document is padded on the right, and the targets of
the padded positions are :data:`IGNORE_INDEX`, so ``cross_entropy(..., ignore_index=-100)``
skips them. Right padding with causal attention needs no attention mask: a real token only
attends to positions before it, which are real too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

IGNORE_INDEX = -100  # what F.cross_entropy skips by default
PAD, EOS = "<pad>", "<eos>"
CORPUS = Path(__file__).resolve().parent / "corpus" / "devils_dictionary.txt"


def default_cache_dir() -> Path:
    """``$PPBOOK_CACHE``, else ``_build/cache`` in the repository (never committed)."""
    if os.environ.get("PPBOOK_CACHE"):
        return Path(os.environ["PPBOOK_CACHE"])
    return Path(__file__).resolve().parents[2] / "_build" / "cache"


def read_text(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist; pass --data with a UTF-8 text file, or leave it out "
                         f"to use the corpus shipped with the book")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"data file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise ValueError(f"data file {path} is empty")
    return text


def split_documents(text: str) -> list[str]:
    """One document per dictionary entry (a paragraph that starts with ``WORD, ``), or per
    blank-line-separated paragraph for any other text."""
    docs = re.split(r"\n\s*\n(?=[A-Z][A-Z0-9'\-. ]*, )", text)
    if len(docs) < 10:  # not the dictionary's layout: paragraphs
        docs = re.split(r"\n\s*\n", text)
    return [d.strip() for d in docs if d.strip()]


# --- tokenizer --------------------------------------------------------------------------------
def train_tokenizer(docs: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (the GPT-2/Llama 3 kind) trained on ``docs``; specials first:
    ``<pad>`` is id 0, ``<eos>`` id 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return tok


@contextlib.contextmanager
def _file_lock(path: Path):
    """Every rank may ask for the tokenizer at once: the first trains it, the others wait."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_tokenizer(text: str, vocab_size: int, cache_dir: str | Path | None = None) -> Path:
    """The path of a ``tokenizer.json`` trained on ``text``; trained and saved on first use."""
    import tokenizers

    if vocab_size < 256 + 2:
        raise ValueError(f"a byte-level BPE tokenizer needs --vocab of at least 258 (256 bytes and 2 special "
                         f"tokens), got {vocab_size}")
    key = hashlib.sha256(f"{tokenizers.__version__}|{vocab_size}|".encode() + text.encode()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / "tokenizers" / f"bpe-{vocab_size}-{key}.json"
    with _file_lock(path.with_suffix(".lock")):
        if not path.is_file():
            tok = train_tokenizer(split_documents(text), vocab_size)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tok.save(str(tmp))
            os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path


def load_tokenizer(path: str | Path, vocab_size: int):
    """A ``tokenizer.json`` whose vocabulary must be exactly the model's ``vocab_size``."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"tokenizer file {path} does not exist; pass a Hugging Face tokenizer.json, or leave out "
                         f"--tokenizer-file to train one on the corpus")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the library raises a bare Exception on malformed JSON
        raise ValueError(f"tokenizer file {path} is not a Hugging Face tokenizer.json: {str(err).splitlines()[0]}") \
            from None
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"tokenizer {path.name} has {tok.get_vocab_size()} tokens but the model's --vocab is "
                         f"{vocab_size}; pass --vocab {tok.get_vocab_size()} so that every id has an embedding row")
    return tok


def special_ids(tok) -> tuple[int, int]:
    """(pad id, end-of-text id). Tokenizers without a pad token (Llama's) pad with end-of-text:
    padded positions are found by length, never by id, so the two may coincide."""
    eos = next((tok.token_to_id(t) for t in (EOS, "</s>", "<|endoftext|>", "<|end_of_text|>")
                if tok.token_to_id(t) is not None), None)
    if eos is None:
        raise ValueError("the tokenizer has no end-of-text token (<eos>, </s>, <|endoftext|> or <|end_of_text|>)")
    pad = next((tok.token_to_id(t) for t in (PAD, "<|pad|>", "[PAD]") if tok.token_to_id(t) is not None), eos)
    return pad, eos


# --- rows ---------------------------------------------------------------------------------------
def encode_rows(tok, docs: list[str], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents as rows of ``seq_len + 1`` token ids, and how many of each row are real.

    Each document plus end-of-text is cut into rows of ``seq_len + 1`` (a row's last token is
    the next row's first input, so no prediction is lost); the last row is right-padded.
    Returns ids (N, seq_len + 1) and lengths (N,).
    """
    pad, eos = special_ids(tok)
    rows, lengths = [], []
    for enc in tok.encode_batch(docs):
        ids = enc.ids + [eos]
        for start in range(0, max(len(ids) - 1, 1), seq_len):
            chunk = ids[start:start + seq_len + 1]
            if len(chunk) < 2:
                continue
            lengths.append(len(chunk))
            rows.append(chunk + [pad] * (seq_len + 1 - len(chunk)))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(lengths, dtype=torch.long)


def inputs_and_targets(
    rows: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (B, T) and targets (B, T), the targets
    of padded positions set to IGNORE_INDEX."""
    # (B, T) each; contiguous: torch 2.11 checks strides
    tokens, targets = rows[:, :-1].contiguous(), rows[:, 1:].clone()
    # (T,) on the rows' device: a CPU tensor beside a GPU one fails
    positions = torch.arange(targets.shape[1], device=targets.device)
    lengths = lengths.to(targets.device)
    # target j is row[j + 1]
    targets[positions[None, :] >= (lengths[:, None] - 1)] = IGNORE_INDEX
    return tokens, targets


@dataclass
class Dataset:
    """Encoded train and held-out rows, and what produced them."""

    train: tuple[torch.Tensor, torch.Tensor]  # rows (N, T+1), lengths (N,)
    eval: tuple[torch.Tensor, torch.Tensor]
    tokenizer_path: str | None
    source: str
    pad_id: int

    def describe(self) -> dict:
        n_tok = lambda split: int(split[1].sum() - len(split[1]))  # noqa: E731  predicted tokens
        return {"source": self.source, "tokenizer": self.tokenizer_path, "train_rows": len(self.train[0]),
                "eval_rows": len(self.eval[0]), "train_tokens": n_tok(self.train), "eval_tokens": n_tok(self.eval)}


def split_rows(rows: torch.Tensor, lengths: torch.Tensor, eval_every: int = 10):
    """Every ``eval_every``-th row is held out for evaluation (the dictionary is alphabetical, so a
    contiguous tail would be one letter)."""
    held = torch.arange(len(rows)) % eval_every == eval_every - 1
    return (rows[~held], lengths[~held]), (rows[held], lengths[held])


def load_local(seq_len: int, vocab_size: int, data: str | Path | None = None, tokenizer_file: str | Path | None = None,
               cache_dir: str | Path | None = None) -> Dataset:
    """The offline default: a text file (the shipped corpus unless ``data``) and a BPE tokenizer
    trained on it and cached (unless ``tokenizer_file``)."""
    path = Path(data) if data else CORPUS
    text = read_text(path)
    tok_path = Path(tokenizer_file) if tokenizer_file else cached_tokenizer(text, vocab_size, cache_dir)
    tok = load_tokenizer(tok_path, vocab_size)
    rows, lengths = encode_rows(tok, split_documents(text), seq_len)
    return Dataset(*split_rows(rows, lengths), str(tok_path), str(path), special_ids(tok)[0])


def load_hub(name: str, tokenizer_file: str | Path, seq_len: int, vocab_size: int, config: str | None = None,
             split: str = "train", text_field: str = "text", max_docs: int = 10_000) -> Dataset:  # pragma: no cover
    """The seed's path: a ``datasets`` dataset by name (downloaded by ``datasets``) and a
    Hugging Face ``tokenizer.json`` (for example from ``huggingface-cli download <model>
    tokenizer.json``). Needs ``pip install datasets`` and a network; not run by the book's tests."""
    try:
        import datasets
    except ImportError:
        raise ValueError("--dataset needs the datasets package: pip install datasets") from None
    tok = load_tokenizer(tokenizer_file, vocab_size)
    ds = datasets.load_dataset(name, config, split=f"{split}[:{max_docs}]")
    if text_field not in ds.column_names:
        raise ValueError(f"dataset {name} has no column {text_field!r}; its columns are {ds.column_names}; "
                         f"pass --text-field")
    docs = [t for t in ds[text_field] if t and t.strip()]
    rows, lengths = encode_rows(tok, docs, seq_len)
    return Dataset(*split_rows(rows, lengths), str(tokenizer_file), f"datasets:{name}", special_ids(tok)[0])


# --- batches whose position is state ------------------------------------------------------------
class Batches:
    """Global batches of ``batch_size`` rows, shuffled per epoch from ``seed``; every rank draws
    the same ones. Where the iterator stands (epoch, position) is explicit state, so a resumed
    run (chapter 7) continues with exactly the batch an uninterrupted run would have drawn."""

    def __init__(self, rows: torch.Tensor, lengths: torch.Tensor, batch_size: int, seed: int):
        if len(rows) < batch_size:
            raise ValueError(f"only {len(rows)} training rows, fewer than --batch-size {batch_size}; use a smaller "
                             f"batch or more text")
        self.rows, self.lengths, self.batch_size, self.seed = rows, lengths, batch_size, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> torch.Tensor:
        return torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed * 1009 + self.epoch))

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) and targets (B, T) of the next batch (a batch never straddles epochs)."""
        if self.position + self.batch_size > len(self.rows):
            self.epoch, self.position = self.epoch + 1, 0
        idx = self._order()[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return inputs_and_targets(self.rows[idx], self.lengths[idx])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]


def eval_batches(rows: torch.Tensor, lengths: torch.Tensor, batch_size: int, max_batches: int | None = None):
    """The held-out rows in order, as full batches (the remainder is dropped so every batch
    splits into equal microbatches)."""
    n = len(rows) // batch_size
    n = min(n, max_batches) if max_batches else n
    return [inputs_and_targets(rows[i * batch_size:(i + 1) * batch_size], lengths[i * batch_size:(i + 1) * batch_size])
            for i in range(n)]
