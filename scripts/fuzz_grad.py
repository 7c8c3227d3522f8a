"""Run the gradient fuzzer (thunderlite/tests/test_fuzz_grad.py) over many seeds.

    python scripts/fuzz_grad.py --seeds 2000 [--start 0] [--jit]

Prints the count of each outcome and every failing seed with its program.
Exit status 1 if any seed differs from eager."""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "thunderlite" / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_fuzz_grad import check_seed, generate


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2000)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jit", action="store_true", help="run each program through thunderlite.jit")
    opts = ap.parse_args()
    counts: collections.Counter = collections.Counter()
    failures = []
    for seed in range(opts.start, opts.start + opts.seeds):
        try:
            counts[check_seed(seed, via_jit=opts.jit)] += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported with its seed
            counts["FAIL"] += 1
            failures.append(f"seed {seed}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
                            f"  program: {generate(seed)}")
    for f in failures:
        print(f)
    print(dict(counts))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
