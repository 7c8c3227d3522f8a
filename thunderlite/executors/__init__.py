"""Executors: the Executor API, the registry, the torch executor, and
``run_trace`` (claim + compile + call) for traces built by hand. The generated
code executors have rooms of their own (``triton/``, ``nvfuser/``, ``symm_mem/``).
May import ``transforms``, the torch language and ``core``; never ``frontend`` or ``api``.

Entry points for other parts of thunderlite:

- ``compile_trace(trace, executors=None) -> (claimed_trace, callable)``
- ``run_trace(trace, args, executors=None)``: e.g. the OpInfo sweep records a
  trace of torch-language symbols and checks ``run_trace(trc, tensors)`` against
  eager torch.
- ``resolve_executors(names_or_executors)`` for ``jit(fn, executors=[...])``.
"""
from thunderlite.executors.base import Executor, FusionExecutor, OperatorExecutor, torch_path
from thunderlite.executors.registry import (
                                            all_executors,
                                            available_executors,
                                            default_executors,
                                            executor_status,
                                            get_executor,
                                            register_executor,
                                            resolve_executors,
                                            skipped_executors,
)
from thunderlite.executors.run import compile_trace, run_trace
from thunderlite.executors.torchcompile import TorchCompileExecutor, torchcompile_executor
from thunderlite.executors.torchex import torch_executor

__all__ = ["Executor", "FusionExecutor", "OperatorExecutor", "torch_path", "all_executors",
           "available_executors", "default_executors", "executor_status", "get_executor",
           "register_executor", "resolve_executors", "skipped_executors", "compile_trace", "run_trace",
           "torch_executor", "TorchCompileExecutor", "torchcompile_executor"]
