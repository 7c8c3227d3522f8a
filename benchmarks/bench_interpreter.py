"""Interpreter overhead on a pure-Python workload.

Run: ``python benchmarks/bench_interpreter.py``; prints
``interpreter slowdown vs CPython: N.Nx``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from thunderlite.interpreter import InterpreterHooks, interpret


class Particle:
    def __init__(self, x, v):
        self.x = x
        self.v = v

    def step(self, dt):
        self.x += self.v * dt
        if self.x < 0 or self.x > 100:
            self.v = -self.v
        return self.x


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def workload(n):
    parts = [Particle(i * 1.5, (i % 7) - 3) for i in range(n)]
    total = 0.0
    for _ in range(20):
        for p in parts:
            total += p.step(0.1)
    words = {}
    for i in range(n * 5):
        key = f"k{i % 37}"
        words[key] = words.get(key, 0) + 1
    squares = sum(x * x for x in range(n * 10) if x % 3)
    return round(total, 3), len(words), squares, fib(15)


class CountingHooks(InterpreterHooks):
    """Hooks that do (almost) nothing, to measure the cost of hook dispatch."""

    def lookaside(self, fn):
        return None

    def load_attr(self, obj, name, value):
        return value


def best_of(fn, arg, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn(arg)
        best = min(best, time.process_time() - t0)
    return best


def main():
    n = 200
    native = best_of(workload, n, 20)
    interp = interpret(workload)
    assert interp(n) == workload(n)
    interpreted = best_of(interp, n, 3)
    hooked = best_of(interpret(workload, CountingHooks()), n, 3)
    print(f"native: {native * 1e3:.1f} ms, interpreted: {interpreted * 1e3:.1f} ms, with hooks: {hooked * 1e3:.1f} ms")
    print(f"interpreter slowdown vs CPython: {interpreted / native:.1f}x")


if __name__ == "__main__":
    main()
