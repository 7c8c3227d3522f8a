"""Programs: standard-library functions run through the interpreter."""
# ruff: noqa
from __future__ import annotations

from interp_harness import program


@program()
def textwrap_fill():
    import textwrap
    text = "The quick brown fox jumps over the lazy dog " * 3
    return textwrap.fill(text, width=30), textwrap.shorten(text, 25), textwrap.dedent("  a\n  b"), textwrap.indent("x\ny", "> ")


@program()
def textwrap_wrap():
    import textwrap
    return textwrap.wrap("alpha beta gamma delta epsilon", 11)


@program()
def json_roundtrip():
    import json
    data = {"a": [1, 2.5, None, True], "b": {"c": "d\u00e9"}, "e": []}
    s = json.dumps(data, sort_keys=True, indent=2)
    return s, json.loads(s) == data, json.dumps([1, "x"], separators=(",", ":"))


@program()
def json_decode_error():
    import json
    return json.loads("{bad json}")


@program()
def fractions_arith():
    from fractions import Fraction
    a = Fraction(1, 3)
    b = Fraction("2/7")
    return a + b, a * b, a / b, a - b, str(a ** 2), Fraction(0.75), a < b, Fraction(10, 4).limit_denominator(3)


@program()
def fractions_error():
    from fractions import Fraction
    return Fraction(1, 0)


@program()
def statistics_funcs():
    import statistics
    xs = [2, 4, 4, 4, 5, 5, 7, 9]
    return statistics.mean(xs), statistics.median(xs), statistics.mode(xs), round(statistics.pstdev(xs), 6), round(statistics.variance(xs), 6)


@program()
def statistics_error():
    import statistics
    return statistics.mean([])


@program()
def difflib_funcs():
    import difflib
    a = "one\ntwo\nthree\n".splitlines(keepends=True)
    b = "one\nTWO\nthree\nfour\n".splitlines(keepends=True)
    return list(difflib.unified_diff(a, b, "a", "b")), round(difflib.SequenceMatcher(None, "abcd", "abed").ratio(), 4), difflib.get_close_matches("appel", ["ape", "apple", "peach"])


@program()
def heapq_funcs():
    import heapq
    h = []
    for v in [5, 1, 8, 3, 2]:
        heapq.heappush(h, v)
    smallest = [heapq.heappop(h) for _ in range(3)]
    return smallest, heapq.nlargest(2, [4, 9, 1, 7]), heapq.nsmallest(2, ["bb", "a", "ccc"], key=len), list(heapq.merge([1, 4], [2, 3]))


@program()
def collections_counter():
    from collections import Counter
    c = Counter("abracadabra")
    return c.most_common(2), c["a"], sorted((c + Counter("aa")).items()), list(c.elements())[:3]


@program()
def collections_defaultdict_deque():
    from collections import defaultdict, deque
    d = defaultdict(list)
    for k, v in [("a", 1), ("b", 2), ("a", 3)]:
        d[k].append(v)
    q = deque([1, 2, 3], maxlen=4)
    q.appendleft(0)
    q.append(4)
    q.rotate(1)
    return dict(d), list(q)


@program()
def collections_ordereddict_chainmap():
    from collections import OrderedDict, ChainMap
    od = OrderedDict()
    od["b"] = 1
    od["a"] = 2
    od.move_to_end("b")
    cm = ChainMap({"x": 1}, {"x": 2, "y": 3})
    return list(od), cm["x"], cm["y"], sorted(cm)


@program()
def itertools_funcs():
    import itertools as it
    return (list(it.chain([1], (2, 3))), list(it.product("ab", repeat=2)), list(it.permutations(range(3), 2)),
            list(it.combinations("abc", 2)), list(it.accumulate([1, 2, 3], lambda a, b: a * b)),
            [(k, list(g)) for k, g in it.groupby("aabbbc")], list(it.zip_longest("ab", "c", fillvalue="-")),
            list(it.starmap(pow, [(2, 3), (3, 2)])), list(it.compress("abcd", [1, 0, 1, 0])),
            list(it.islice(it.count(5, 2), 3)), list(it.repeat("z", 2)), list(it.filterfalse(lambda x: x % 2, range(5))))


@program()
def functools_funcs():
    import functools
    @functools.lru_cache(maxsize=None)
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    @functools.wraps(fib)
    def wrapper(*a):
        return fib(*a)

    return (fib(30), functools.reduce(lambda a, b: a * b, range(1, 6)), functools.reduce(lambda a, b: a + b, [], 0),
            wrapper.__name__, sorted(["bb", "a", "ccc"], key=functools.cmp_to_key(lambda x, y: len(x) - len(y))))


@program()
def functools_singledispatch():
    import functools

    @functools.singledispatch
    def show(x):
        return "obj"

    @show.register
    def _(x: int):
        return "int"

    @show.register(list)
    def _(x):
        return "list"

    return show(1), show([1]), show("s")


@program()
def contextlib_funcs():
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print("captured")
    @contextlib.contextmanager
    def tag(name):
        yield f"<{name}>"
    with tag("p") as t:
        pass
    with contextlib.nullcontext(5) as n:
        pass
    return buf.getvalue(), t, n


@program()
def re_module():
    import re
    s = "alpha=1, beta=22, gamma=333"
    pairs = re.findall(r"(\w+)=(\d+)", s)
    sub = re.sub(r"\d+", lambda m: str(int(m.group()) * 2), s)
    m = re.match(r"(?P<name>\w+)=", s)
    return pairs, sub, m.group("name"), re.split(r",\s*", s), bool(re.fullmatch(r"[a-z]+", "abc")), re.escape("a.b")


@program()
def re_compiled_patterns():
    import re
    pat = re.compile(r"(\d{3})-(\d{4})")
    m = pat.search("call 555-1234 now")
    return m.groups(), m.span(), pat.sub(r"\2-\1", "111-2222"), [x.group() for x in pat.finditer("123-4567 890-1234")]


@program()
def string_module():
    import string
    t = string.Template("$who likes $what")
    return t.substitute(who="tim", what="kung pao"), string.ascii_lowercase[:5], string.capwords("hello big world"), string.Formatter().format("{0}-{1}", "a", "b")


@program()
def string_formatting_advanced():
    return ("{:,}".format(1234567), "{:08.3f}".format(3.14159), "{:+d}".format(5), "{:#x}".format(255), "{:e}".format(12345.678),
            "{:%}".format(0.25), "{:^10s}|".format("mid"), "{0[1]}{1[k]}".format([1, 2], {"k": 3}), "%5.1f|%-4s|%03d" % (2.25, "ab", 7))


@program()
def math_module():
    import math
    return math.gcd(12, 18), math.lcm(4, 6), math.factorial(10), math.comb(5, 2), math.isclose(0.1 + 0.2, 0.3), math.prod([1, 2, 3, 4]), math.hypot(3, 4), math.log2(1024)


@program()
def decimal_module():
    from decimal import Decimal, getcontext
    getcontext().prec = 10
    return str(Decimal("1.1") + Decimal("2.2")), str(Decimal(1) / Decimal(7)), Decimal("3.14").quantize(Decimal("0.1"))


@program()
def bisect_module():
    import bisect
    xs = [1, 3, 5, 7]
    bisect.insort(xs, 4)
    return xs, bisect.bisect_left(xs, 5), bisect.bisect_right(xs, 5), bisect.bisect(xs, 0)


@program()
def random_seeded():
    import random
    r = random.Random(42)
    xs = list(range(10))
    r.shuffle(xs)
    return r.randint(1, 100), r.choice("abcdef"), xs, round(r.random(), 6), r.sample(range(100), 3)


@program()
def operator_module():
    import operator
    items = [("b", 2), ("a", 1), ("c", 0)]
    return sorted(items, key=operator.itemgetter(1)), list(map(operator.attrgetter("real"), [1, 2])), operator.methodcaller("upper")("x"), operator.add(1, 2)


@program()
def copy_module():
    import copy
    a = [[1, 2], {"k": [3]}]
    b = copy.copy(a)
    c = copy.deepcopy(a)
    a[0].append(9)
    return b[0], c[0], c[1] == a[1]


@program()
def datetime_module():
    import datetime
    d = datetime.date(2024, 2, 28)
    dt = datetime.datetime(2024, 1, 1, 12, 30)
    return str(d + datetime.timedelta(days=2)), d.isoformat(), dt.strftime("%Y/%m/%d %H:%M"), (datetime.date(2024, 3, 1) - d).days, d.weekday()


@program()
def dataclass_replace_fields():
    import dataclasses

    @dataclasses.dataclass
    class P:
        x: int
        y: int = 0

    p = P(1, 2)
    return repr(dataclasses.replace(p, y=5)), [f.name for f in dataclasses.fields(P)], dataclasses.astuple(p)


@program()
def enum_auto_and_flags():
    import enum

    class Shape(enum.Enum):
        CIRCLE = enum.auto()
        SQUARE = enum.auto()

    class Perm(enum.Flag):
        R = enum.auto()
        W = enum.auto()
        X = enum.auto()

    rw = Perm.R | Perm.W
    return [s.value for s in Shape], Perm.R in rw, Perm.X in rw, Shape.CIRCLE.name, str(Shape.SQUARE)


@program()
def enum_lookup_error():
    import enum

    class E(enum.Enum):
        A = 1

    return E(5)


@program()
def typing_helpers():
    from typing import Optional, List, cast

    def f(x: int, y: Optional[str] = None) -> List[int]:
        return [x]

    return cast(int, "notreally"), f(3), Optional[int] == Optional[int]


@program()
def shlex_and_csv():
    import csv
    import io
    import shlex
    rows = list(csv.reader(io.StringIO('a,b\n1,"x,y"\n')))
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["q", 'w"e'])
    return shlex.split('cmd "quoted arg" plain'), rows, out.getvalue(), shlex.quote("a b")


@program()
def base64_hashlib():
    import base64
    import hashlib
    return base64.b64encode(b"hello"), base64.b64decode("aGk="), hashlib.sha256(b"x").hexdigest()[:16], hashlib.md5(b"y").hexdigest()[:8]


@program()
def struct_and_binascii():
    import binascii
    import struct
    packed = struct.pack("<ihd", 1, -2, 0.5)
    return packed, struct.unpack("<ihd", packed), binascii.hexlify(b"ab"), struct.calcsize("<ihd")


@program()
def pprint_module():
    import pprint
    data = {"z": list(range(12)), "a": {"nested": ("t", 1)}}
    return pprint.pformat(data, width=40)


@program()
def urllib_parse():
    from urllib.parse import urlparse, urlencode, parse_qs, quote
    u = urlparse("https://example.com:8080/path/x?q=1&r=2#frag")
    return u.scheme, u.netloc, u.path, parse_qs(u.query), urlencode({"a": 1, "b": "x y"}), quote("a b/c")


@program()
def ipaddress_module():
    import ipaddress
    net = ipaddress.ip_network("192.168.1.0/30")
    return [str(h) for h in net.hosts()], ipaddress.ip_address("10.0.0.1").is_private, str(ipaddress.ip_address("::1"))


@program()
def colorsys_and_calendar():
    import calendar
    import colorsys
    return tuple(round(v, 4) for v in colorsys.rgb_to_hsv(0.2, 0.4, 0.6)), calendar.isleap(2024), calendar.monthrange(2023, 2)


@program()
def graphlib_sort():
    from graphlib import TopologicalSorter
    ts = TopologicalSorter({"b": {"a"}, "c": {"b"}, "d": {"a"}})
    order = list(ts.static_order())
    return order.index("a") < order.index("b") < order.index("c"), len(order)


@program()
def fnmatch_and_posixpath():
    import fnmatch
    import posixpath
    return fnmatch.filter(["a.py", "b.txt", "c.py"], "*.py"), posixpath.splitext("dir/file.tar.gz"), posixpath.normpath("a/./b/../c"), posixpath.basename("/x/y.z")


@program()
def html_and_string_escape():
    import html
    return html.escape("<a href='x'>&</a>"), html.unescape("&lt;p&gt;&amp;"), repr("tab\there")


@program()
def zlib_and_io():
    import io
    import zlib
    data = b"abc" * 100
    comp = zlib.compress(data)
    bio = io.BytesIO()
    bio.write(comp)
    return len(zlib.decompress(bio.getvalue())), zlib.crc32(b"hello")


@program()
def sorting_stability_and_keys():
    records = [("bob", 3), ("al", 1), ("cy", 3), ("di", 2)]
    by_score = sorted(records, key=lambda r: r[1])
    by_two = sorted(records, key=lambda r: (-r[1], r[0]))
    records.sort(key=lambda r: r[0], reverse=True)
    return by_score, by_two, records, min(records, key=lambda r: r[1]), max(records, key=lambda r: len(r[0]))


@program()
def weakref_module():
    import weakref

    class Obj:
        pass

    o = Obj()
    r = weakref.ref(o)
    d = weakref.WeakValueDictionary()
    d["k"] = o
    return r() is o, "k" in d


@program()
def array_and_queue():
    import array
    import queue
    a = array.array("i", [1, 2, 3])
    a.append(4)
    q = queue.PriorityQueue()
    for v in (3, 1, 2):
        q.put(v)
    return a.tolist(), [q.get() for _ in range(3)]


@program()
def secrets_free_uuid():
    import uuid
    u = uuid.UUID("12345678123456781234567812345678")
    return str(u), u.version, uuid.uuid5(uuid.NAMESPACE_DNS, "python.org").hex


@program()
def tokenize_keyword():
    import keyword
    return keyword.iskeyword("for"), keyword.iskeyword("four"), len(keyword.kwlist) > 30


@program()
def abc_registration():
    import abc
    from collections.abc import Sized, Iterable

    class MySized:
        def __len__(self):
            return 3

    class Base(abc.ABC):
        @abc.abstractmethod
        def go(self):
            ...

    class Impl(Base):
        def go(self):
            return "went"

    return isinstance(MySized(), Sized), isinstance([], Iterable), Impl().go()


@program()
def inspect_signature():
    import inspect

    def f(a, b=2, *c, d, **e):
        pass

    sig = inspect.signature(f)
    return str(sig), list(sig.parameters), sig.bind(1, d=4).arguments


@program()
def dis_instructions_count():
    import dis

    def f(x):
        return x + 1

    return len(list(dis.get_instructions(f))) > 0


@program()
def traceback_format():
    import traceback
    try:
        raise ValueError("tb")
    except ValueError as e:
        lines = traceback.format_exception_only(type(e), e)
    return lines


@program()
def string_io_readlines():
    import io
    f = io.StringIO("l1\nl2\nl3\n")
    first = f.readline()
    rest = [l.rstrip() for l in f]
    return first, rest


@program()
def tempfile_roundtrip():
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "f.txt")
        with open(p, "w") as fh:
            fh.write("content\n")
        with open(p) as fh:
            data = fh.read()
        exists = os.path.exists(p)
    return data, exists


@program()
def numbers_and_types():
    import numbers
    import types
    ns = types.SimpleNamespace(a=1, b=2)
    ns.c = 3
    return isinstance(3, numbers.Integral), isinstance(2.5, numbers.Real), sorted(vars(ns)), types.MappingProxyType({"x": 1})["x"]
