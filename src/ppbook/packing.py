"""Packed rows: several documents in one row, and what each pipeline stage derives from them.

Introduced in chapter 15 ("Packed documents through a pipeline"). Pretraining code concatenates
documents and cuts the stream into rows of one length, so that no position is padding. Attention
must then stay inside each document, and every stage needs to know where the documents are.
What travels through the pipeline is one tensor with a batch dimension, the document index of
every position (``doc_ids``, (B, T)); the schedule cuts it into microbatches with the tokens, and
each stage derives from its own microbatch what its attention kernel needs:

* :func:`document_mask`: a boolean (b, 1, T, T) mask for ``scaled_dot_product_attention``;
* :func:`position_ids`: positions that restart at every document (rotary embeddings);
* :func:`cu_seqlens`: the cumulative segment offsets of a variable-length kernel
  (``flash_attn_varlen_func``'s layout), for *this microbatch's* flattened tokens;
* :func:`varlen_attention`: a reference of such a kernel, causal within each segment, so the
  CPU can run what a GPU kernel computes.

All are pure functions of tensors, tested without processes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppbook.data import IGNORE_INDEX


def pack_stream(doc_lengths: list[int], rows: int, seq_len: int, vocab: int,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Documents of ``doc_lengths`` tokens, concatenated and cut into ``rows`` rows of ``seq_len``.

    Returns ``tokens``, ``targets`` and ``doc_ids``, each (rows, seq_len). A document cut at a row's
    end continues in the next row as a new segment; ``doc_ids`` number the segments of each row
    from 0. A target is the next token of the same document, and :data:`IGNORE_INDEX` where the
    next position starts another document or the stream has run out (the last row's tail), so
    every row scores a different number of tokens.
    """
    need = rows * seq_len
    ids = torch.repeat_interleave(torch.arange(len(doc_lengths)), torch.tensor(doc_lengths))
    if len(ids) < need + 1:  # the stream's tail: a padding "document" that scores nothing
        ids = torch.cat([ids, torch.full((need + 1 - len(ids),), -1)])
    ids = ids[:need + 1]
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(2, vocab, (need + 1,), generator=g)
    tokens = stream[:need].view(rows, seq_len)
    following = stream[1:].view(rows, seq_len)
    same_doc = (ids[:need] == ids[1:]) & (ids[:need] >= 0)
    targets = torch.where(same_doc.view(rows, seq_len), following, torch.full_like(following, IGNORE_INDEX))
    doc = ids[:need].view(rows, seq_len)
    # renumber per row: a row's segments are 0, 1, 2, ... (a document cut by a row end splits)
    change = torch.ones_like(doc, dtype=torch.bool)
    change[:, 1:] = doc[:, 1:] != doc[:, :-1]
    doc_ids = change.long().cumsum(1) - 1
    return tokens.contiguous(), targets.contiguous(), doc_ids.contiguous()


def starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True where a segment starts (every row's first position and every change)."""
    first = torch.ones_like(doc_ids[:, :1], dtype=torch.bool)
    return torch.cat([first, doc_ids[:, 1:] != doc_ids[:, :-1]], dim=1)


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document index of each position -> (B, 1, T, T) bool: causal, and within one document
    (True where a query may attend)."""
    T = doc_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()  # (T, T)
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
    return (causal & same_doc)[:, None]


def document_mask_mod(doc_ids: torch.Tensor):
    """The same mask as a FlexAttention ``mask_mod`` over this microbatch's ``doc_ids`` (B, T)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)
    return mask_mod


def position_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token inside its document: 0 at every segment's start."""
    T = doc_ids.shape[1]
    idx = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)  # (B, T)
    first = torch.where(starts(doc_ids), idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


def cu_seqlens(doc_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative segment offsets of the (B, T) microbatch flattened to B*T tokens, int32,
    ``[0, end of segment 0, ..., B*T]``: what a variable-length kernel takes with the tokens laid
    out as (B*T, H, hd). Rows never share a segment, so every row start is a boundary."""
    flat = starts(doc_ids).flatten()
    begin = flat.nonzero().flatten()
    end = torch.tensor([flat.numel()], device=doc_ids.device)
    return torch.cat([begin, end]).to(torch.int32)


def stack_cu_seqlens(per_microbatch: list[torch.Tensor]) -> torch.Tensor:
    """Microbatches' ``cu_seqlens`` as one (m, K) tensor (each row repeats its last offset up to the
    longest), so that a schedule splitting dim 0 into m chunks hands microbatch i its own row.
    A repeated offset is an empty segment, which :func:`varlen_attention` skips."""
    longest = max(len(c) for c in per_microbatch)
    return torch.stack([torch.cat([c, c[-1:].expand(longest - len(c))]) for c in per_microbatch])


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Causal attention inside each segment ``[cu[i], cu[i+1])`` of tokens laid out as (N, H, hd):
    what ``flash_attn_varlen_func(q, k, v, cu, cu, ..., causal=True)`` computes, as a loop of
    ``scaled_dot_product_attention`` calls. Like the GPU kernels it checks nothing: offsets past
    ``N`` are cut to ``N`` by slicing, and positions outside every segment stay zero."""
    out = torch.zeros_like(q)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b <= a or a >= q.shape[0]:
            continue
        seg = [t[a:b].transpose(0, 1)[None] for t in (q, k, v)]  # (1, H, len, hd) each
        out[a:b] = F.scaled_dot_product_attention(*seg, is_causal=True)[0].transpose(0, 1)
    return out


def tokens_per_microbatch(targets: torch.Tensor, m: int) -> list[int]:
    """How many targets each of the ``m`` microbatches scores (as the schedule splits dim 0)."""
    return [int((t != IGNORE_INDEX).sum()) for t in targets.tensor_split(m)]


def microbatch_weights(counts: list[int]) -> tuple[list[float], list[float]]:
    """The weight one token of each microbatch gets in the step's loss: with a mean per microbatch
    and ``scale_grads`` (1 / (m * n_i)), and with the step's token mean (1 / N, the right one)."""
    m, total = len(counts), sum(counts)
    return [1 / (m * n) for n in counts], [1 / total] * m
