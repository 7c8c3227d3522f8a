"""Run the in-place/aliasing differential fuzzer over many seeds.

    python scripts/fuzz_inplace.py --seeds 5000 [--start 0] [--jit]
    python scripts/fuzz_inplace.py --jit --executors torchcompile,torch --seeds 5000
    python scripts/fuzz_inplace.py --grad [--executors torchcompile,torch] --seeds 5000

Each seed is a random program of views, writes and reads over inputs that may
share storage, compared with eager PyTorch: a trace-level program after the
alias pipeline in a random topological order (thunderlite/tests/test_fuzz_inplace.py),
or with ``--jit`` a Python program through ``thunderlite.jit``, plain and with
a randomly reordering fusion executor (thunderlite/tests/test_fuzz_inplace_jit.py),
or with ``--executors`` through the jit with exactly those executors; with
``--grad`` the jit programs' arguments require grad and gradients are compared
too (thunderlite/tests/test_fuzz_inplace_grad.py). The jit programs also read
and write a tensor in a global, closure or module whose aliasing with the
arguments changes from call to call of one jitted function (the cache's alias
guards), and use ``torch.no_grad()`` regions, custom ops and
``torch.autograd.Function``s; a failure names the call and its relations.

With the real torchcompile executor most of the time is Inductor compiling
each program's regions: the seeds run in one process, so regions that repeat
across programs reuse the executor's compiled artifacts (and Inductor's own
caches), and Inductor compiles in this process (``compile_threads = 1``)
instead of starting a pool of workers. ``--progress N`` prints the count,
failures so far and seconds per seed every N seeds.
Prints the failing seeds with their programs; exits 1 if any failed."""
from __future__ import annotations

import argparse
import sys
import time
from functools import partial

import torch

from thunderlite.tests import test_fuzz_inplace, test_fuzz_inplace_grad, test_fuzz_inplace_jit


def _checker(opts):
    module = test_fuzz_inplace_grad if opts.grad else test_fuzz_inplace_jit if opts.jit else test_fuzz_inplace
    if opts.executors:
        torch._inductor.config.compile_threads = 1
        return partial((test_fuzz_inplace_grad if opts.grad else test_fuzz_inplace_jit).check_seed,
                       executors=opts.executors.split(","))
    return module.check_seed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--jit", action="store_true", help="fuzz Python programs through thunderlite.jit")
    parser.add_argument("--grad", action="store_true", help="jit programs whose arguments require grad")
    parser.add_argument("--executors", default="",
                        help="comma-separated executor list for the jit fuzzer (e.g. torchcompile,torch)")
    parser.add_argument("--progress", type=int, default=0, help="print progress every N seeds")
    opts = parser.parse_args()
    check_seed = _checker(opts)
    failed = []
    start = time.perf_counter()
    for done, seed in enumerate(range(opts.start, opts.start + opts.seeds), 1):
        try:
            check_seed(seed)
        except AssertionError as err:
            failed.append(seed)
            print(err, file=sys.stderr)
        if opts.progress and done % opts.progress == 0:
            elapsed = time.perf_counter() - start
            print(f"{done} seeds ({opts.start}..{seed}): {len(failed)} differ, {elapsed / done:.2f} s/seed",
                  flush=True)
    elapsed = time.perf_counter() - start
    print(f"{opts.seeds} seeds from {opts.start}: {len(failed)} differ from eager "
          f"({elapsed:.1f} s, {elapsed / max(opts.seeds, 1):.2f} s/seed){': ' + str(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
