"""The cache of compiled entries and what decides a hit: the key function per
call signature (keys.py), the entries and their fast guards (entries.py), and
the guards on aliasing the key cannot see (alias_guard.py).

May import what frontend may import (executors, transforms, the torch
language, core, interpreter) and the frontend modules beside it; never ``api``
or the front doors above it."""
