"""One sentence through a model: the translation with each piece's probability, and its attention with per-token loss.

The translation is the search `tmt translate` runs (``decoding.search`` with the checkpoint's length limits,
on the Translator's model), so its text is `tmt translate`'s for the same beam and length penalty. The
probabilities come from one teacher-forced pass over that output (``Transformer.decode``), with the search's
rule that pad and the decoder's start id are never generated; their log-probs add up to the search's log-prob of the
hypothesis (up to float rounding: the search adds them one step at a time). The attention is `tmt attention`'s
(``analysis.sentence_maps``), the same JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_mt.analysis import sentence_maps
from transformer_mt.data import collate, source_tensor
from transformer_mt.decoding import BeamStep, Hypothesis, Translator, max_output_length, search
from transformer_mt.explore.session import RequestError, single_model


def run_search(
    tr: Translator, src_ids: list[int], *, beam: int, lenpen: float, observer: Callable[[BeamStep], None] | None = None
) -> list[Hypothesis]:
    """The search `tmt translate` runs for one sentence (without EOS): ``beam`` hypotheses, best first (the
    winner is the same whatever the n-best size). ``observer`` sees every beam step (beam > 1)."""
    d = tr.cfg.decode
    src = source_tensor([src_ids], specials=single_model(tr).specials).to(tr.device)  # (1, S): pieces + EOS
    with torch.inference_mode():
        return search(
            tr.model,
            src,
            beam=beam,
            lenpen=lenpen,
            max_len_a=d.max_len_a,
            max_len_b=d.max_len_b,
            nbest=beam,
            observer=observer,
        )[0]


def output_limit(tr: Translator, n_src: int) -> int:
    """The longest output the search allows a source of ``n_src`` pieces (+ EOS), as it computes it."""
    d = tr.cfg.decode
    limit = max_output_length(n_src + 1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    model_limit = tr.model.max_output_length()
    return limit if model_limit is None else min(limit, model_limit)


def piece_of(tr: Translator, *, side: str = "tgt") -> Callable[[int], str]:
    tok = tr.tgt_tok if side == "tgt" else tr.src_tok
    return tok.id_to_piece


def token_table(tr: Translator, src_ids: list[int], tgt_ids: list[int], *, topk: int) -> list[dict]:
    """Teacher-force ``tgt_ids`` on ``src_ids``: per decoder position (the pieces of the target, then ``</s>``)
    its id, piece, log-prob and probability, loss (-log p, no label smoothing) and the ``topk`` most
    probable pieces there (``alternatives``, best first, the chosen one included)."""
    model, device = single_model(tr), tr.device
    # src (1, S), tgt_in (1, T) = start + target, tgt_out (1, T) = target + EOS
    batch = collate([(src_ids, tgt_ids)], specials=model.specials)
    with torch.inference_mode():
        logits = model.decode(batch.tgt_in.to(device), model.encode(batch.src.to(device)))[0]  # (T, V)
        lprobs = torch.log_softmax(logits.float(), dim=-1)  # (T, V) float32, as the search computes them
        lprobs[:, list(model.specials.never_generated)] = -math.inf  # as the search: pad and start are never generated
        top_lp, top_id = lprobs.topk(min(topk, lprobs.size(1)), dim=-1)  # (T, k)
    piece = piece_of(tr)
    labels = batch.tgt_out[0].tolist()  # (T,)
    chosen = lprobs.gather(1, batch.tgt_out[0].view(-1, 1).to(device))[:, 0].tolist()  # (T,)
    rows = []
    for t, (label, lp) in enumerate(zip(labels, chosen)):
        alternatives = [
            {"id": i, "piece": piece(i), "prob": math.exp(v)} for v, i in zip(top_lp[t].tolist(), top_id[t].tolist())
        ]
        rows.append(
            {
                "id": label,
                "piece": piece(label),
                "logprob": lp,
                "prob": math.exp(lp),
                "loss": -lp,
                "alternatives": alternatives,
            }
        )
    return rows


def translation_view(tr: Translator, src_ids: list[int], *, beam: int, lenpen: float, topk: int) -> dict:
    """The translation of one sentence (`tmt translate`'s), its score, and the table of its pieces."""
    hyp = run_search(tr, src_ids, beam=beam, lenpen=lenpen)[0]
    table = token_table(tr, src_ids, hyp.tokens, topk=topk)
    # The search stops a hypothesis at EOS or at the longest output; in the latter case the last row (</s>) is
    # the model's probability of ending there, not part of the output.
    ended = len(hyp.tokens) < output_limit(tr, len(src_ids))
    for row in table:
        row["in_output"] = True
    table[-1]["in_output"] = ended
    piece = piece_of(tr, side="src")
    return {
        "translation": tr.tgt_tok.decode([hyp.tokens])[0],
        "score": hyp.score,
        "logprob": hyp.logprob,
        "ended_with_eos": ended,
        "beam": beam,
        "lenpen": lenpen,
        "src_pieces": [piece(i) for i in src_ids] + ["</s>"],
        "tokens": table,
    }


def attention_view(
    tr: Translator, text: str, *, reference: str | None, beam: int, lenpen: float, topk: int, max_weights: int
) -> dict:
    """`tmt attention`'s JSON for ``text`` (the translation's maps, or teacher-forcing ``reference``), with the
    target's token table (per-token loss; its mean is the reference's cross-entropy in nats per token). Refused
    (413) when the maps hold more than ``max_weights`` weights: as nested JSON lists each costs about 20 bytes, so a
    long sentence of a deep model would be an answer of hundreds of MB."""
    maps = sentence_maps(tr, text, reference=reference, beam=beam, lenpen=lenpen)
    weights = maps.encoder_self.numel() + maps.decoder_self.numel() + maps.cross.numel()  # L x H x (S^2 + T^2 + T*S)
    if weights > max_weights:
        raise RequestError(
            413,
            f"text: its attention maps hold {weights:,} weights (layers x heads x (S^2 + T^2 + T*S) for "
            f"{maps.encoder_self.size(-1)} source and {maps.cross.size(-2)} target pieces), more than "
            f"--max-attention {max_weights:,}; give a shorter sentence",
        )
    src_ids = tr.src_tok.encode([text])[0][: tr.max_src_tokens]
    if reference is not None:
        tgt_ids = tr.tgt_tok.encode([reference])[0]
    else:  # the search's own ids (encoding the decoded text again need not give them back)
        tgt_ids = run_search(tr, src_ids, beam=beam, lenpen=lenpen)[0].tokens
    table = token_table(tr, src_ids, tgt_ids, topk=topk)
    out = maps.to_json()
    out.update(tokens=table, mean_loss=sum(r["loss"] for r in table) / len(table), beam=beam, lenpen=lenpen)
    return out
