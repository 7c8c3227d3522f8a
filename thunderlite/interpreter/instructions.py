"""A code object's instructions as ``dis.get_instructions`` reads them, without
its costs: decoding is paid once per code object, on the first call of every
function a program reaches, and ``dis`` builds an ``Instruction`` and a
``Positions`` tuple, a label set, a line table and an argument repr string per
instruction, none of which the interpreter reads.

``instructions(code)`` returns ``(offset, opcode, opname, arg, argval)`` for
each instruction, CACHE entries left out, with ``argval`` exactly as ``dis``
resolves it on this Python (3.10 to 3.13: constants, names, locals and cells,
jump targets, comparison operators, format conversions). On 3.13 the
resolution is ``dis``'s own ``ArgResolver``. ``tests/interpreter/
test_instructions.py`` compares it with ``dis`` over the standard library's code.
"""
from __future__ import annotations

import dis
import sys

_V = sys.version_info[:2]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_INT_OVERFLOW = 2 ** 32
_OPNAME = getattr(dis, "_all_opname", dis.opname)


def _table(members) -> list[bool]:
    s = set(members)
    return [op in s for op in range(256)]


def _cache_sizes() -> list[int]:
    if _V < (3, 11):
        return [0] * 256
    if _V >= (3, 13):
        return [dis._get_cache_size(_OPNAME[op]) if op < len(_OPNAME) else 0 for op in range(256)]
    entries = dis._inline_cache_entries
    return [entries[op] if op < len(entries) else 0 for op in range(256)]


_CACHES = _cache_sizes()
_TAKES_ARG = _table(dis.hasarg) if _V >= (3, 12) else [op >= dis.HAVE_ARGUMENT for op in range(256)]
_CONST, _NAME, _LOCAL, _FREE = _table(dis.hasconst), _table(dis.hasname), _table(dis.haslocal), _table(dis.hasfree)
_JREL, _JABS, _COMPARE = _table(dis.hasjrel), _table(getattr(dis, "hasjabs", ())), _table(dis.hascompare)
_BACKWARD = [("JUMP_BACKWARD" in _OPNAME[op]) if op < len(_OPNAME) else False for op in range(256)]
_OP = dis.opmap
_NAME_SHIFT = {_OP["LOAD_GLOBAL"]: 1} if _V >= (3, 11) else {}
if _V >= (3, 12):
    _NAME_SHIFT.update({_OP["LOAD_ATTR"]: 1, _OP["LOAD_SUPER_ATTR"]: 2})
_FORMAT_VALUE = _OP.get("FORMAT_VALUE")
_CONVERTERS = (None, str, repr, ascii)
_COMPARE_SHIFT = 4 if _V == (3, 12) else 0


def _unpack(co: bytes) -> list[tuple[int, int, int | None]]:
    """(offset, opcode, arg) of each instruction, as ``dis._unpack_opargs``."""
    caches, takes_arg = _CACHES, _TAKES_ARG
    out = []
    extended = i = 0
    n = len(co)
    while i < n:
        op = co[i]
        if takes_arg[op]:
            arg = co[i + 1] | extended
            extended = (arg << 8) if op == _EXTENDED_ARG else 0
            if extended >= _INT_OVERFLOW:
                extended -= 2 * _INT_OVERFLOW
        else:
            arg = None
            extended = 0
        out.append((i, op, arg))
        i += 2 + 2 * caches[op]
    return out


if _V >= (3, 13):
    class _Resolver(dis.ArgResolver):
        """``dis``'s resolution without its label map (only the reprs use labels)."""

        def get_label_for_offset(self, offset):
            return 0


def instructions(code) -> list[tuple]:
    """``(offset, opcode, opname, arg, argval)`` per instruction of ``code`` (see the module docstring)."""
    out = []
    opname = _OPNAME
    if _V >= (3, 13):
        resolve = _Resolver(co_consts=code.co_consts, names=code.co_names,
                            varname_from_oparg=code._varname_from_oparg).get_argval_argrepr
        for offset, op, arg in _unpack(code.co_code):
            out.append((offset, op, opname[op], arg, resolve(op, arg, offset)[0]))
        return out
    consts, names = code.co_consts, code.co_names
    if _V >= (3, 11):
        varname = code._varname_from_oparg
    else:
        cells = code.co_cellvars + code.co_freevars
        varname = code.co_varnames.__getitem__
    for offset, op, arg in _unpack(code.co_code):
        argval = arg
        if arg is None:
            pass
        elif _CONST[op]:
            # 3.11 resolves LOAD_CONST only (KW_NAMES is dis.UNKNOWN there)
            argval = consts[arg] if _V != (3, 11) or opname[op] == "LOAD_CONST" else dis.UNKNOWN
        elif _NAME[op]:
            argval = names[arg >> _NAME_SHIFT.get(op, 0)]
        elif _JABS[op]:
            argval = arg * 2
        elif _JREL[op]:
            argval = offset + 2 + (-arg if _V >= (3, 11) and _BACKWARD[op] else arg) * 2
            if _V >= (3, 12):
                argval += 2 * _CACHES[op]
        elif _LOCAL[op]:
            argval = varname(arg)
        elif _FREE[op]:
            argval = varname(arg) if _V >= (3, 11) else cells[arg]
        elif _COMPARE[op]:
            argval = dis.cmp_op[arg >> _COMPARE_SHIFT]
        elif op == _FORMAT_VALUE:
            argval = (_CONVERTERS[arg & 0x3], bool(arg & 0x4))
        out.append((offset, op, opname[op], arg, argval))
    return out
