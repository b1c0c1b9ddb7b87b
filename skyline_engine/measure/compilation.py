"""What torch.compile did while the user's iteration ran: the graphs compiled, and how long that took.

Dynamo compiles a frame the first time it runs, and again for shapes it has not seen (a second
batch size makes the batch dimension dynamic; later ones reuse that graph). Compiling takes
seconds, so it must not land inside a timed iteration: the runner warms up every batch size of a
compiled model, and reports what each compiled, apart from the iteration's time.

The recorded iteration of the breakdown and the memory count see each operation through a
TorchDispatchMode, which needs the model's own eager code: they run an *eager replay* of the same
iteration (`eager_replay`), while the timed iterations run the compiled one. Left to itself, dynamo
would skip a frame that runs under such a mode and mark its code as not to be compiled again, so
that a later, new batch size ran eagerly in its timed iterations too: the replay asks for eager
code through `torch.compiler.set_stance("force_eager")` instead, which marks nothing.

The figures are dynamo's own counters: `unique_graphs` and the time in `_compile.compile_inner`
(one entry per compiled frame, forward and backward graphs included).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


def is_compiled(model: torch.nn.Module) -> bool:
    """`torch.compile(module)` somewhere in the model (a compiled function inside the iteration
    shows only once it has run: `compiler_work`)."""
    compiled = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    return compiled is not None and any(isinstance(m, compiled) for m in model.modules())


@contextlib.contextmanager
def eager_replay() -> Iterator[None]:
    """The iteration's eager code, for a dispatch mode to see (see the module docstring)."""
    set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    if set_stance is None:
        yield
        return
    with set_stance("force_eager"):
        yield


def quiet_about_global_hooks() -> None:
    """The engine's global module hooks (phases, parameter creation) make every call of a compiled
    module warn that they will fire twice; they are the engine's, and fire as the engine expects."""
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")


@dataclass(frozen=True)
class CompilerWork:
    graphs: int
    seconds: float

    def __add__(self, other: CompilerWork) -> CompilerWork:
        return CompilerWork(self.graphs + other.graphs, self.seconds + other.seconds)

    def __sub__(self, earlier: CompilerWork) -> CompilerWork:
        return CompilerWork(self.graphs - earlier.graphs, self.seconds - earlier.seconds)


NOTHING_COMPILED = CompilerWork(0, 0.0)

# `compilation.peak_memory`.
COMPILED_PROGRAM_PEAK = "compiled_program"
EAGER_REPLAY_PEAK = "eager_replay"


def compiler_work() -> CompilerWork:
    """All that dynamo has compiled in this process so far (nothing before it is imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return NOTHING_COMPILED
    graphs = int(utils.counters["stats"].get("unique_graphs", 0))
    seconds = float(sum(utils.compilation_time_metrics.get("_compile.compile_inner", ())))
    return CompilerWork(graphs, seconds)


@dataclass(frozen=True)
class Compilation:
    """What was compiled at each batch size, in the order the batch sizes first ran."""

    by_batch_size: tuple[tuple[int, CompilerWork], ...]
    # Where the peak memory comes from: the compiled program's own (CUDA: the allocator's peak
    # over a plain iteration) or the eager replay's (the CPU: tensors counted at the dispatcher).
    peak_memory: str = EAGER_REPLAY_PEAK

    @property
    def graphs(self) -> int:
        return sum(work.graphs for _, work in self.by_batch_size)

    @property
    def seconds(self) -> float:
        return sum(work.seconds for _, work in self.by_batch_size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "graphs": self.graphs,
            "seconds": self.seconds,
            "batch_sizes": [
                {"batch_size": b, "graphs": work.graphs, "seconds": work.seconds} for b, work in self.by_batch_size
            ],
            "peak_memory": self.peak_memory,
        }
