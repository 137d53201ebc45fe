"""What a server allows: its limits, deadlines, keys and batching (``ServeOptions``), and the API-key file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformer_mt.serve.errors import ServeError

MIB = 1 << 20
# Request bodies at the cap held at once by default: enough for a burst of the largest requests; the
# connection cap (1024) times the body cap (30 MB by default) would be 30 GiB.
BODY_BUDGET_BODIES = 8
# shorter keys can be guessed; `python -c "import secrets; print(secrets.token_urlsafe(32))"` makes one
MIN_KEY_CHARS = 16


@dataclass
class ServeOptions:
    """Limits, deadlines, keys and batching of the service (the package docstring says what answers what)."""

    max_lines: int = 256  # lines in one request; more -> 413
    max_chars: int = 10_000  # characters in one line; more -> 413 (model-length overflow is truncated instead)
    max_beam: int = 16  # largest beam a request may ask for; more -> 422
    max_queue: int = 256  # requests waiting per model; more -> 503
    batch_wait_ms: float = 5.0  # how long a batch waits for the rest of a wave of concurrent requests
    # source tokens per decode call (a large request is split into chunks); 0 = the checkpoint's decode.batch_tokens
    batch_tokens: int = 0
    timeout: float = 60.0  # seconds from a request's headers to its answer; then 504 (0 = no deadline)
    # longest output per line, whatever the checkpoint's max_len_a / max_len_b allow (0 = no cap)
    max_output_tokens: int = 512
    header_timeout: float = 10.0  # seconds for a request head (headers) to arrive; then the connection is closed
    keep_alive_timeout: int = 5  # seconds an idle keep-alive connection stays open
    max_connections: int = 1024  # connections and requests at once; more get 503 from uvicorn
    shutdown_timeout: int = 30  # seconds SIGTERM waits for requests in flight before it closes them (0 = no bound)
    # when set, every path but /health and /ready needs one (401); never printed
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # bytes of request bodies held at once, all connections together; more -> 503 (0 = BODY_BUDGET_BODIES bodies
    # at the cap)
    body_budget: int = 0
    # Host header values answered besides the bound address (hosts.allowed_hosts); "*" = any
    allowed_hosts: tuple[str, ...] = ()

    def check(self) -> None:
        for key in ("max_lines", "max_chars", "max_beam", "max_queue", "keep_alive_timeout", "max_connections"):
            if getattr(self, key) < 1:
                raise ServeError(f"--{key.replace('_', '-')} {getattr(self, key)}: must be at least 1")
        for key in ("batch_wait_ms", "timeout", "max_output_tokens", "shutdown_timeout"):
            if not getattr(self, key) >= 0:  # NaN fails too
                raise ServeError(f"--{key.replace('_', '-')} {getattr(self, key)}: must be >= 0 (0 = none)")
        if not self.header_timeout > 0:
            raise ServeError(f"--header-timeout {self.header_timeout}: must be > 0 seconds")
        if self.batch_tokens < 0:
            raise ServeError(
                f"batch_tokens={self.batch_tokens}: must be >= 0 (0 = the checkpoint's decode.batch_tokens)"
            )
        if self.body_budget and not self.body_budget >= self.max_body_bytes:
            raise ServeError(
                f"--body-budget-mb {self.body_budget / MIB:.4g}: less than one body at the cap "
                f"({self.max_body_bytes / MIB:.4g} MiB, from --max-lines x --max-chars); raise it, lower those, "
                "or give 0 for the default"
            )

    @property
    def max_body_bytes(self) -> int:
        """The raw body cap: the largest JSON the text limits allow, every character written in the longest
        encoding JSON has (a surrogate pair of ``\\uXXXX`` escapes, 12 bytes), so text within --max-lines and
        --max-chars is never refused for its encoding; the limits on the decoded text then apply exactly."""
        return self.max_lines * (12 * self.max_chars + 4) + 4096

    @property
    def body_budget_bytes(self) -> int:
        """The bytes of request bodies the server holds at once, all connections together."""
        return self.body_budget or BODY_BUDGET_BODIES * self.max_body_bytes


def load_api_keys(path: str | Path) -> tuple[str, ...]:
    """The keys of ``path``: one a line; blank lines and lines starting with # are skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ServeError(
            f"--api-key-file {path}: cannot read it ({getattr(exc, 'strerror', None) or exc}); "
            "give a UTF-8 file of keys, one a line"
        ) from None
    keys = []
    for number, raw in enumerate(text.splitlines(), start=1):
        key = raw.strip()
        if not key or key.startswith("#"):
            continue
        if not key.isascii() or not key.isprintable() or " " in key or len(key) < MIN_KEY_CHARS:
            raise ServeError(
                f"--api-key-file {path}, line {number}: a key must be at least {MIN_KEY_CHARS} printable ASCII "
                'characters without spaces; make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
            )
        keys.append(key)
    if not keys:
        raise ServeError(f"--api-key-file {path}: holds no key; write one key per line")
    return tuple(keys)
