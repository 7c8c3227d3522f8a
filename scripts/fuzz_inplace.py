"""Run the in-place/aliasing differential fuzzer over many seeds.

    python scripts/fuzz_inplace.py --seeds 5000 [--start 0] [--jit]

Each seed is a random program of views, writes and reads over inputs that may
share storage, compared with eager PyTorch: a trace-level program after the
alias pipeline in a random topological order (thunderlite/tests/test_fuzz_inplace.py),
or with ``--jit`` a Python program through ``thunderlite.jit``, plain and with
a randomly reordering fusion executor (thunderlite/tests/test_fuzz_inplace_jit.py).
Prints the failing seeds with their programs; exits 1 if any failed."""
from __future__ import annotations

import argparse
import sys
import time

from thunderlite.tests import test_fuzz_inplace, test_fuzz_inplace_jit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--jit", action="store_true", help="fuzz Python programs through thunderlite.jit")
    opts = parser.parse_args()
    check_seed = (test_fuzz_inplace_jit if opts.jit else test_fuzz_inplace).check_seed
    failed = []
    start = time.perf_counter()
    for seed in range(opts.start, opts.start + opts.seeds):
        try:
            check_seed(seed)
        except AssertionError as err:
            failed.append(seed)
            print(err, file=sys.stderr)
    elapsed = time.perf_counter() - start
    print(f"{opts.seeds} seeds from {opts.start}: {len(failed)} differ from eager "
          f"({elapsed:.1f} s){': ' + str(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
