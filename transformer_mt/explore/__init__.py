"""`tmt explore`: a local web page that shows a model at work on one sentence (the `serve` extra).

What the page shows, each from the code path of the command that computes it:

- the translation, exactly `tmt translate`'s for the same settings (the search of ``decoding``), with each target
  piece's probability and its most probable alternatives (a teacher-forced pass over the output);
- beam search step by step: the open hypotheses, the finished ones with raw and length-penalised scores, why the
  search stopped and why the winner won (an observer passed to ``decoding.beam_search``);
- attention: encoder self, decoder self and cross, per layer and head, `tmt attention`'s JSON
  (``analysis.sentence_maps``), for the translation or a teacher-forced reference with its per-token loss;
- the masks and shapes of the batch (``analysis.traced``, as `tmt inspect` records them) and the positional
  encodings of its positions (``analysis.position_table``).

Modules: ``session`` (the checkpoints by name, the example sentences, request checks), ``analysis``
(translation, probabilities, attention and loss), ``trace`` (the beam-search observer), ``anatomy`` (masks,
shapes, positions), ``app`` (the FastAPI application), ``guard`` (the body cap), ``server`` (start-up and
serving), ``errors``, ``static/`` (the page, its script and style, served by tmt itself: no CDN, works offline).

A leaf above ``serve`` (whose Host check and server it reuses): the core never imports it; fastapi and uvicorn
are imported only when the page is served.
"""

from transformer_mt.explore.errors import INSTALL_HINT, ExploreError
from transformer_mt.explore.server import Background, build, explore, require_fastapi
from transformer_mt.explore.session import Explorer, Limits, RequestError, load_explorer

__all__ = [
    "INSTALL_HINT",
    "Background",
    "ExploreError",
    "Explorer",
    "Limits",
    "RequestError",
    "build",
    "explore",
    "load_explorer",
    "require_fastapi",
]
