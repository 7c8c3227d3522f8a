"""``thunderlite.extend``: the extension API (as Lightning Thunder's ``thunder.extend``).

Executors decide how the symbols of a trace run; transforms rewrite traces at
named points of the pipeline. Both plug in without touching thunderlite::

    from thunderlite.extend import OperatorExecutor, register_executor

    myex = OperatorExecutor("myex")
    myex.register_implementation("ltorch.sin", my_sin, checker=lambda a: a.dtype == torch.float32)
    register_executor(myex)
    jfn = thunderlite.jit(fn, executors=[myex, "torchcompile", "torch"])   # priority = list order

- ``OperatorExecutor``: implementations per symbol (``register_implementation``
  with ``checker=``, ``grad_transform=``, ``execution_transform=``) and new
  operators (``register_operator``); ``get_grad`` / ``put_grad`` inside a
  grad_transform.
- ``FusionExecutor``: replaces regions (``transforms/fusion.py``'s shared
  region former) by symbols it compiles.
- ``Transform``: hooks ``after_tracing``, ``after_autodiff``,
  ``after_claiming`` (queries ``bind_inputs``, ``prefetch_units``);
  ``jit(fn, transforms=[...])``. ``CUDAGraphs`` is one
  (``jit(fn, cudagraphs=True)``).
- The registry: ``register_executor``, ``get_executor``, ``get_all_executors``,
  ``get_default_executors``, ``add_default_executor``, ``remove_default_executor``.
- Symmetric memory: ``SymmMemExecutor(backend=...)`` (the ``symm_mem`` executor
  with another backend, e.g. a fake one in tests), ``declare_symm_mem_args``
  (thunderlite's own declarations beside torch's ``register_symm_mem_args``),
  ``symm_mem_args`` (what an op declares).

``notebooks/extending.ipynb`` walks through all of it. A public face: it
re-exports from ``executors`` and ``transforms`` and defines nothing of its own.
"""
from thunderlite.executors.base import Executor, FusionExecutor, Implementation, OperatorExecutor
from thunderlite.executors.cudagraphs.runtime import CUDAGraphs
from thunderlite.executors.registry import (
                                            add_default_executor,
                                            get_all_executors,
                                            get_default_executors,
                                            get_executor,
                                            register_executor,
                                            remove_default_executor,
)
from thunderlite.executors.symm_mem.executor import SymmMemBackend, SymmMemExecutor
from thunderlite.executors.symm_mem.plan import declare_symm_mem_args, symm_mem_args
from thunderlite.transforms.autodiff.executors import get_grad, put_grad
from thunderlite.transforms.user import Transform

__all__ = ["CUDAGraphs", "Executor", "OperatorExecutor", "FusionExecutor", "Implementation", "Transform",
           "register_executor", "get_executor", "get_default_executors", "add_default_executor",
           "remove_default_executor", "get_all_executors", "get_grad", "put_grad", "SymmMemExecutor", "SymmMemBackend",
           "declare_symm_mem_args", "symm_mem_args"]
