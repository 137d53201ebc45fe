"""GraphedStep: a search's steps on static buffers shared by every batch, bucketed by batch size, captured as CUDA
graphs on a GPU. On a CPU its eager replay runs the same buffers, buckets and copies (everything but the capture),
and a stand-in capturer runs the capture path's bookkeeping; the expectations are the growing cache's hypotheses on
the tiny trained checkpoint and real Multi30k sentences. The real capture is the ``cuda`` test."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from tests.conftest import head, tiny_model
from tests.decoding.test_static_search import assert_same
from transformer_mt.data import source_tensor
from transformer_mt.decoding import (
    GraphedStep,
    SearchError,
    beam_search,
    greedy_search_batches,
    model_from_checkpoint,
    static_decoding_by_default,
)
from transformer_mt.decoding.graphs import CapturedStep, bucket
from transformer_mt.model import StaticDecoderCache, Transformer, choose_ops

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, corpus_slice) -> tuple[Transformer, list[torch.Tensor]]:
    """The tiny trained model and 24 real validation sources in batches of 3, 11 and 10, in that order (so that the
    shared buffers grow after the first)."""
    ck = model_from_checkpoint(tiny_checkpoint)
    ids = ck.src_tok.encode(head(corpus_slice["val.en"], 24))
    return ck.model.eval(), [source_tensor(ids[a:b]) for a, b in ((0, 3), (3, 14), (14, 24))]


def test_buckets_are_powers_of_two_up_to_the_top() -> None:
    assert [bucket(n, top=48) for n in (1, 2, 3, 5, 8, 9, 33, 48)] == [1, 2, 4, 8, 8, 16, 48, 48]
    assert [bucket(n, top=512, smallest=8) for n in (1, 8, 9, 100)] == [8, 8, 16, 128]


def test_eager_replay_gives_the_growing_caches_hypotheses(trained) -> None:
    """Greedy over three batches, beam 5 with its 5-best over two: the live groups bucketed to powers of two (3 -> 4
    and 11 -> 16 sentences, smaller buckets as sentences finish, at most 64 // 5 = 12 groups of 5 beams), the rest of
    the bucket dummies; the buffers grow for 11 sentences, then for 11 x 5 rows."""
    model, batches = trained
    graphs = GraphedStep(model, max_rows=64, max_src=64, max_len=128)
    assert not graphs.capture  # a CPU: the eager replay
    found = greedy_search_batches(model, batches, graphs=graphs)
    for hyps, expected in zip(found, greedy_search_batches(model, batches)):
        assert_same([[h] for h in hyps], [[h] for h in expected])
    assert (graphs.stats.growths, graphs.stats.eager_batches, graphs.stats.replays) == (1, 0, 0)
    assert {groups for groups, group, _ in graphs.buckets} >= {16, 8, 4, 2, 1}  # the last batch's sentences finishing
    for src in batches[:2]:
        assert_same(beam_search(model, src, beam=5, nbest=5, graphs=graphs), beam_search(model, src, beam=5, nbest=5))
    width = bucket(batches[1].size(1), top=64, smallest=8)
    assert graphs.stats.growths == 2 and (12, 5, width) in graphs.buckets and (16, 5, width) not in graphs.buckets


def test_dummy_rows_do_not_change_the_live_rows(trained) -> None:
    """Rows past the batch, in the bucket a step runs on, hold whatever the buffers held: here large garbage."""
    model, batches = trained
    src = batches[1][:5]  # 5 sentences -> a bucket of 8
    results = []
    for garbage in (False, True):
        graphs = GraphedStep(model, max_rows=16, max_src=64, max_len=128)
        with torch.inference_mode():
            cache = graphs.init_cache(model.encode(src), max_len=40)
            assert isinstance(cache, StaticDecoderCache)
            if garbage:
                pool = graphs._pools[0]
                assert pool.keys is not None and pool.values is not None and pool.cross_allowed is not None
                g = torch.Generator().manual_seed(0)
                for t in (pool.keys[:, 5:], pool.values[:, 5:], pool.cross_k[:, 5:], pool.cross_v[:, 5:]):
                    t.copy_(torch.randn(t.shape, generator=g) * 1e3)
                pool.cross_allowed[5:] = torch.rand(pool.cross_allowed[5:].shape, generator=g) < 0.5
                pool.cross_allowed[5:, ..., 0] = True
                graphs._tokens[5:] = torch.randint(4, 1000, (graphs._tokens.size(0) - 5,), generator=g)
            step = torch.full((5,), model.specials.start)
            logits = []
            for _ in range(4):
                logits.append(graphs.decode_step(step, cache))
                step = logits[-1].argmax(-1)
        assert graphs.buckets == [(8, 1, bucket(src.size(1), top=64, smallest=8))]
        results.append(torch.stack(logits))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_a_batch_outside_the_buckets_runs_eagerly_on_its_own_cache(trained) -> None:
    model, batches = trained
    graphs = GraphedStep(model, max_rows=8, max_src=64, max_len=128)  # 11 sentences do not fit
    found = greedy_search_batches(model, batches, graphs=graphs)
    for hyps, expected in zip(found, greedy_search_batches(model, batches)):
        assert_same([[h] for h in hyps], [[h] for h in expected])
    assert graphs.stats.eager_batches == 2  # 11 and 10 sentences; the 3 fit
    assert graphs.stats.eager_replays > 0


def replaying(step):
    """A stand-in for CUDA graph capture: the warm-up runs the step (as on the side stream), the "capture" too (a
    real capture only records), and a replay runs it again into the output the capture returned."""
    step()
    output = step()

    def replay() -> None:
        output.copy_(step())

    return CapturedStep(replay, output)


def test_the_capture_path_restores_the_position_and_replays(trained) -> None:
    """With a capturer, each bucket is captured once (the warm-up really steps: the position goes back), then
    replayed; the hypotheses are the growing cache's."""
    model, batches = trained
    graphs = GraphedStep(model, max_rows=64, max_src=64, max_len=128, capture=True, capturer=replaying)
    found = greedy_search_batches(model, batches[1:], graphs=graphs)
    for hyps, expected in zip(found, greedy_search_batches(model, batches[1:])):
        assert_same([[h] for h in hyps], [[h] for h in expected])
    assert_same(
        beam_search(model, batches[0], beam=4, nbest=2, graphs=graphs), beam_search(model, batches[0], beam=4, nbest=2)
    )
    stats = graphs.stats
    assert stats.captures == len(graphs.buckets) > 3 and stats.replays > stats.captures and stats.eager_replays == 0


def test_searches_in_two_threads_take_turns(trained) -> None:
    """A Translator may be shared by threads: two searches on one GraphedStep hold its lock in turn."""
    model, batches = trained
    graphs = GraphedStep(model, max_rows=64)
    expected = [greedy_search_batches(model, [src]) for src in batches]
    found: dict[int, list] = {}

    def search(i: int) -> None:
        with torch.inference_mode():
            found[i] = greedy_search_batches(model, [batches[i]], graphs=graphs)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(found) == list(range(len(batches)))
    for i, hyps in found.items():
        assert_same([[h] for h in hyps[0]], [[h] for h in expected[i][0]])


def test_an_older_batchs_cache_is_refused(trained) -> None:
    model, batches = trained
    graphs = GraphedStep(model, max_rows=64)
    with torch.inference_mode():
        first = graphs.init_cache(model.encode(batches[0]), max_len=20)
        graphs.init_cache(model.encode(batches[0]), max_len=20)
        with pytest.raises(SearchError, match="one search at a time"):
            graphs.decode_step(torch.full((3,), model.specials.start), first)


def test_graphs_belong_to_one_model(trained) -> None:
    model, batches = trained
    with pytest.raises(SearchError, match="made for another model"):
        greedy_search_batches(model, batches[:1], graphs=GraphedStep(tiny_model()))


def test_the_cpu_keeps_the_growing_cache_by_default(trained) -> None:
    assert not static_decoding_by_default(trained[0])


def test_capture_needs_cuda_or_a_capturer() -> None:
    with pytest.raises(ValueError, match="needs a CUDA device"):
        GraphedStep(tiny_model(), capture=True)
    assert GraphedStep(tiny_model(), capture=True, capturer=replaying).capture


@pytest.mark.cuda
def test_cuda_graphs_give_the_growing_caches_hypotheses(trained) -> None:
    """The real capture: the model on the GPU, greedy and beam 5 replayed from CUDA graphs."""
    model, batches = trained
    gpu = model_copy_on_cuda(model)
    srcs = [src.cuda() for src in batches]
    graphs = GraphedStep(gpu)
    assert graphs.capture and static_decoding_by_default(gpu)
    found = greedy_search_batches(gpu, srcs, graphs=graphs)
    for hyps, expected in zip(found, greedy_search_batches(gpu, srcs)):
        assert_same([[h] for h in hyps], [[h] for h in expected])
    for src in srcs:
        assert_same(beam_search(gpu, src, beam=5, nbest=5, graphs=graphs), beam_search(gpu, src, beam=5, nbest=5))
    assert graphs.stats.captures > 0 and graphs.stats.replays > graphs.stats.captures
    assert graphs.stats.eager_replays == 0 and graphs.stats.eager_batches == 0


def model_copy_on_cuda(model: Transformer) -> Transformer:
    return copy.deepcopy(model).cuda().use_ops(choose_ops("auto", "cuda")).eval()
