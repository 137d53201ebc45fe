"""``torch.compile`` for training (``train.compile``), by region: each encoder and decoder layer, and the cuda
backend's passes over a chunk of the loss's logits (:mod:`~transformer_mt.model.ops.chunked_loss`).

Regional compilation (torch's "regional compilation" recipe): the layers are compiled in place
(``nn.Module.compile``), not the whole model, so the model, its state dict and its checkpoints stay as they are, a
decoding step stays eager, and the N identical layers of a stack share one graph: torch inlines nn modules, so a
layer's parameters are inputs of its graph rather than constants, and dynamo keeps its graphs per code object
(``EncoderLayer.forward``), where every layer of the stack finds them. The model's backend must be traceable: the
cuda backend and the reference ops it falls back to are; the cpu backend's C++ kernels are not, and
:func:`compile_model` refuses it.

Shapes. A graph is specialised to what it was traced with (shapes, dtypes, the training flag, grad mode, whether an
attention mask is given), and a call that fits none of a region's graphs compiles another. ``dynamic`` is
``torch.compile``'s: None (automatic: the first graph static, a dimension that then changes made symbolic) or True
(symbolic from the first trace, except sizes 0 and 1), the setting here. Token-budget batches change the batch size
and both lengths from batch to batch, so a static graph per shape would never stop compiling; automatic dynamic
shapes compile a static graph first and then one per dimension found to change; symbolic ones from the start make
one graph per region for a whole epoch (and one more for validation: eval mode, no gradient). Padded to a multiple
(``train.pad_to_multiple``), the lengths take fewer values, and the kernels get whole tiles.

The recompile limit. Each region holds at most ``recompile_limit`` graphs; at the limit dynamo keeps them, and a
call none of them fits runs eagerly (the region does not compile again): one line of the run's log says so, in place
of torch's warning.

Private torch APIs, each where no public one does the work:

- ``torch._dynamo.eval_frame._debug_get_cache_entry_list``: a region's graphs (dynamo's cache entries on its code
  object), the number the recompile limit bounds;
- ``torch._dynamo.utils.counters["graph_break"]``: the graph breaks since the compiler was made (0 expected);
- ``torch._dynamo.config.specialize_float`` and ``torch.fx.experimental._config.use_duck_shape``: floats traced as
  constants, equal sizes kept apart (:class:`Compiler` says why);
- the warning dynamo logs at a recompile limit (logger ``torch._dynamo.convert_frame``, message ``torch._dynamo hit
  config.<limit> ...``), read by a logging filter to tell which region fell back.
"""

from __future__ import annotations

import logging
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from transformer_mt.config import ConfigError
from transformer_mt.model.ops import Ops
from transformer_mt.model.ops.cuda import CudaOps

COMPILE_CHOICES = ("auto", "on", "aot_eager", "off")  # train.compile
BACKENDS = ("inductor", "aot_eager")  # inductor generates kernels; aot_eager traces (forward and backward) only
MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")  # train.compile_mode
AUTO_PAD_MULTIPLE = 8  # train.pad_to_multiple 0 while compiling: lengths a multiple of 8 (tensor-core tiles)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CompileSettings:
    """How the regions are compiled."""

    backend: str = "inductor"  # one of BACKENDS
    mode: str = "default"  # inductor's: one of MODES (max-autotune: searched kernels; reduce-overhead: CUDA graphs)
    dynamic: bool | None = True  # torch.compile's (module docstring): symbolic sizes from the first trace
    recompile_limit: int = 8  # graphs per region; past them a call runs eagerly


def compile_setting(setting: str, *, ops_name: str, device_type: str) -> str:
    """``train.compile`` resolved to ``on`` (inductor), ``aot_eager`` or ``off``: ``auto`` is on with the cuda backend
    on a CUDA device, off elsewhere. The cpu backend is refused (ConfigError): its C++ kernels do not trace."""
    if setting not in COMPILE_CHOICES:
        shown = setting if len(setting) <= 60 else setting[:57] + "..."
        raise ConfigError(f"train.compile={shown!r} is not one of {', '.join(COMPILE_CHOICES)}; use auto")
    if setting == "auto":
        return "on" if ops_name == "cuda" and device_type == "cuda" else "off"
    if setting != "off" and ops_name == "cpu":
        raise ConfigError(
            f"train.compile={setting}: the cpu backend's C++ kernels do not trace; use train.ops=cuda or reference "
            "with it, or train.compile=off"
        )
    return setting


def pad_multiple(setting: int, *, compiling: bool, longest: int, max_positions: int) -> int:
    """``train.pad_to_multiple`` resolved: the value given, or with 0 :data:`AUTO_PAD_MULTIPLE` when compiling and 1
    (no padding) otherwise. ``longest``: the longest sequence a batch holds (data.max_len + 1), which padded must
    still fit ``max_positions`` (ConfigError)."""
    if setting < 0:
        raise ConfigError(f"train.pad_to_multiple={setting} is negative; use 0 (auto), 1 (none) or e.g. 8")
    multiple = setting or (AUTO_PAD_MULTIPLE if compiling else 1)
    padded = -(-longest // multiple) * multiple
    if padded > max_positions:
        raise ConfigError(
            f"train.pad_to_multiple={multiple} pads sequences of {longest} positions (data.max_len + 1) to {padded}, "
            f"past model.max_positions={max_positions}; lower data.max_len, raise model.max_positions, or set "
            "train.pad_to_multiple=1"
        )
    return multiple


@dataclass(frozen=True)
class Region:
    """A compiled region: its name in the log, the code object its graphs are kept on, and how many modules (or
    functions) call it."""

    name: str
    code: types.CodeType
    callers: int = 1

    def graphs(self) -> int:
        """Graphs compiled for it so far (dynamo's cache entries on its code)."""
        return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(self.code))


class Compiler:
    """Compiles modules and functions as named regions with one :class:`CompileSettings`, and reports on them.

    ``log``: where the line about a region reaching its recompile limit goes (the run's log)."""

    def __init__(self, settings: CompileSettings = CompileSettings(), *, log: Callable[[str], None] = print):
        if settings.backend not in BACKENDS or settings.mode not in MODES:
            raise ConfigError(
                f"compile backend {settings.backend!r}, mode {settings.mode!r}: the backend is one of "
                f"{', '.join(BACKENDS)}, the mode one of {', '.join(MODES)}"
            )
        self.settings = settings
        self.log = log
        self.regions: dict[str, Region] = {}
        self.at_limit: list[str] = []  # regions that reached their recompile limit, in order
        self._breaks_before = _graph_breaks()
        # Two process settings of torch's, read when a region is traced. The models' floats (dropout rates, norm
        # epsilons, the loss's smoothing) are constants of a run: traced as symbols (with dynamic sizes, since torch
        # 2.6), each would restart the trace to specialise them, twice the compile time. Duck sizing gives sizes
        # that happen to be equal in the first trace one symbol (a batch of 40 rows of 40 tokens; 32 target
        # positions of a d_model of 32, which then specialises both): the next batch would compile again.
        torch._dynamo.config.specialize_float = True
        torch.fx.experimental._config.use_duck_shape = False
        _LimitWatch.install().compilers.add(self)

    def _options(self) -> dict[str, Any]:
        s = self.settings
        options: dict[str, Any] = {"backend": s.backend, "dynamic": s.dynamic, "recompile_limit": s.recompile_limit}
        if s.mode != "default" and s.backend == "inductor":
            options["mode"] = s.mode
        return options

    def _add(self, name: str, code: types.CodeType) -> None:
        known = self.regions.get(name)
        if known is not None and known.code is not code:
            raise ValueError(f"region {name!r} is already another function's ({known.code.co_name})")
        self.regions[name] = Region(name, code, known.callers + 1 if known else 1)

    def module(self, module: nn.Module, region: str) -> None:
        """Compile ``module`` in place (``nn.Module.compile``); modules of one class share region and graphs."""
        self._add(region, type(module).forward.__code__)
        module.compile(**self._options())

    def function(self, fn: F, region: str) -> F:
        """``fn`` compiled, as the region ``region``."""
        self._add(region, fn.__code__)
        return torch.compile(fn, **self._options())  # type: ignore[return-value]  # the same signature, compiled

    def graph_breaks(self) -> int:
        """Graph breaks anywhere in the process since this compiler was made."""
        return _graph_breaks() - self._breaks_before

    def summary(self) -> str:
        """One line: what was compiled, each region's graphs, the graph breaks and the regions at their limit."""
        s = self.settings
        mode = f" {s.mode}" if s.mode != "default" else ""
        how = f"{s.backend}{mode}, dynamic={s.dynamic}, limit {s.recompile_limit}"
        parts = [f"{r.name} x{r.callers}: {_plural(r.graphs(), 'graph')}" for r in self.regions.values()]
        line = f"torch.compile ({how}): {'; '.join(parts) or 'nothing'}; {_plural(self.graph_breaks(), 'graph break')}"
        if self.at_limit:
            line += f"; at the recompile limit, eager for new shapes: {', '.join(self.at_limit)}"
        return line

    def _hit_limit(self, code_name: str, filename: str, line: int, reason: str) -> bool:
        """Dynamo reports a code object at its recompile limit: log one line if it is one of ours (True)."""
        for region in self.regions.values():
            c = region.code
            if (c.co_name, c.co_filename, c.co_firstlineno) == (code_name, filename, line):
                if region.name not in self.at_limit:
                    self.at_limit.append(region.name)
                    self.log(
                        f"torch.compile: {region.name} reached its recompile limit ({self.settings.recompile_limit} "
                        f"graphs); calls that fit none of them run eagerly from now on (last change: {reason[:80]})"
                    )
                return True
        return False


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


class _LimitWatch(logging.Filter):
    """A filter on dynamo's frame logger that hands its recompile-limit warnings to the live compilers; the one
    about a compiler's region is replaced by that compiler's own line."""

    LOGGER = "torch._dynamo.convert_frame"
    _installed: _LimitWatch | None = None

    def __init__(self) -> None:
        super().__init__()
        self.compilers: weakref.WeakSet[Compiler] = weakref.WeakSet()

    @classmethod
    def install(cls) -> _LimitWatch:
        if cls._installed is None:
            cls._installed = cls()
            logging.getLogger(cls.LOGGER).addFilter(cls._installed)
        return cls._installed

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if not msg.startswith("torch._dynamo hit config.") or not isinstance(record.args, tuple):
            return True
        where = _code_of(str(record.args[2]) if len(record.args) > 2 else "")
        reason = str(record.args[3]) if len(record.args) > 3 else ""
        if where is None:
            return True
        return not any(c._hit_limit(*where, reason) for c in list(self.compilers))


def _code_of(func_info: str) -> tuple[str, str, int] | None:
    """Dynamo's "'forward' (/path/layers.py:95)" -> ("forward", "/path/layers.py", 95)."""
    try:
        name, rest = func_info.split(" (", 1)
        filename, line = rest.rstrip(")").rsplit(":", 1)
        return name.strip("'"), filename, int(line)
    except ValueError:
        return None


class LayerStacks(Protocol):
    """What :func:`compile_model` compiles (a Transformer): its two layer stacks and its backend."""

    @property
    def encoder(self) -> Iterable[nn.Module]: ...
    @property
    def decoder(self) -> Iterable[nn.Module]: ...
    @property
    def ops(self) -> Ops: ...
    def use_ops(self, ops: Ops) -> Any: ...


@dataclass
class CompiledModel:
    """What :func:`compile_model` did: its compiler (regions, graphs, :meth:`Compiler.summary`) and the backend the
    model now computes with."""

    compiler: Compiler
    ops: Ops
    layers: list[str] = field(default_factory=list)  # the region of each layer compiled, bottom to top
    loss: bool = False  # the loss's passes compiled too (the cuda backend's)


def compile_model(model: LayerStacks, compiler: Compiler) -> CompiledModel:
    """Compile ``model``'s (a Transformer's) layers in place, one region per layer kind, and give it a backend whose
    loss passes are compiled too (the cuda backend's; the reference loss stays eager). Refuses the cpu backend."""
    ops = model.ops
    if ops.name == "cpu":
        raise ConfigError("torch.compile: the cpu backend's C++ kernels do not trace; use the cuda or reference ops")
    compiled: list[str] = []
    for stack, region in ((model.encoder, "encoder layer"), (model.decoder, "decoder layer")):
        for layer in stack:
            compiler.module(layer, region)
            compiled.append(region)
    if not isinstance(ops, CudaOps):
        return CompiledModel(compiler, ops, compiled)
    ops = ops.compiled(compiler.function)
    model.use_ops(ops)
    return CompiledModel(compiler, ops, compiled, loss=True)
