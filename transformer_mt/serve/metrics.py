"""GET /metrics: the server's counters and histograms in the Prometheus text format (prometheus-client).

Each app has its own ``CollectorRegistry`` (not the process-wide default), so two apps in one process,
as in the tests, count apart. The names, all prefixed ``tmt_``:

- ``tmt_http_requests_total{path, status}``: answered requests (path is a route of the API or "other");
- ``tmt_http_request_seconds{path}``: time from the request's headers to its answer (histogram);
- ``tmt_queue_wait_seconds{model}``: time from a request's submission to its first decoded chunk;
- ``tmt_batch_requests{model}``, ``tmt_batch_lines{model}``, ``tmt_batch_seconds{model}``: per decode call;
- ``tmt_lines_total{model}``, ``tmt_source_tokens_total{model}``, ``tmt_target_tokens_total{model}``;
- ``tmt_dropped_total{model, reason}``: requests abandoned before their end (timeout, disconnected);
- ``tmt_queue_depth{model}``: requests waiting (not in the running batch); ``tmt_worker_alive{model}``;
- ``tmt_request_body_bytes``: bytes of request bodies held now (bounded by --body-budget-mb).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from transformer_mt.serve.batching import BatchEvents

CONTENT_TYPE = CONTENT_TYPE_LATEST
ROUTES = ("/translate", "/health", "/ready", "/models", "/metrics", "/docs", "/openapi.json")
# Seconds: from a few milliseconds (one short line, greedy) to the longest deadline worth answering.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServeMetrics:
    """Every metric of one app, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tmt_http_requests", "HTTP requests answered, by path and status.", ["path", "status"], registry=r
        )
        self.latency = Histogram(
            "tmt_http_request_seconds",
            "Time from a request's headers to its answer.",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "tmt_queue_wait_seconds",
            "Time from a request's submission to its first decoded chunk.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "tmt_batch_requests", "Requests per decode call.", ["model"], buckets=SIZE_BUCKETS, registry=r
        )
        self.batch_lines = Histogram(
            "tmt_batch_lines", "Lines per decode call.", ["model"], buckets=SIZE_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "tmt_batch_seconds", "Duration of one decode call.", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.lines = Counter("tmt_lines", "Lines decoded.", ["model"], registry=r)
        self.source_tokens = Counter(
            "tmt_source_tokens", "Source tokens decoded (pieces + EOS per non-blank line).", ["model"], registry=r
        )
        self.target_tokens = Counter(
            "tmt_target_tokens", "Tokens generated in the best hypotheses (+ EOS each).", ["model"], registry=r
        )
        self.dropped = Counter("tmt_dropped", "Requests abandoned before their end.", ["model", "reason"], registry=r)
        self.queue_depth = Gauge(
            "tmt_queue_depth", "Requests waiting, not in the running batch.", ["model"], registry=r
        )
        self.worker_alive = Gauge("tmt_worker_alive", "1 while the model's worker thread runs.", ["model"], registry=r)
        self.body_bytes = Gauge(
            "tmt_request_body_bytes", "Bytes of request bodies held now, all connections together.", registry=r
        )

    def request(self, path: str, status: int, seconds: float) -> None:
        label = path if path in ROUTES else "other"  # a bounded label set, whatever paths clients try
        self.requests.labels(path=label, status=str(status)).inc()
        self.latency.labels(path=label).observe(seconds)

    def for_model(self, model: str, *, depth: Callable[[], float], alive: Callable[[], float]) -> ModelEvents:
        """The batcher events of one model, and its gauges read at scrape time."""
        self.queue_depth.labels(model=model).set_function(depth)
        self.worker_alive.labels(model=model).set_function(alive)
        return ModelEvents(self, model)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelEvents(BatchEvents):
    """One model's batcher reporting into :class:`ServeMetrics` (called from its worker thread)."""

    def __init__(self, metrics: ServeMetrics, model: str):
        self.m, self.model = metrics, model

    def started(self, waited_s: float) -> None:
        self.m.queue_wait.labels(model=self.model).observe(waited_s)

    def batch(self, *, requests: int, lines: int, tokens: int, seconds: float) -> None:
        self.m.batch_requests.labels(model=self.model).observe(requests)
        self.m.batch_lines.labels(model=self.model).observe(lines)
        self.m.batch_seconds.labels(model=self.model).observe(seconds)
        self.m.lines.labels(model=self.model).inc(lines)
        self.m.source_tokens.labels(model=self.model).inc(tokens)

    def dropped(self, reason: str) -> None:
        self.m.dropped.labels(model=self.model, reason=reason).inc()

    def generated(self, tokens: int) -> None:
        self.m.target_tokens.labels(model=self.model).inc(tokens)
