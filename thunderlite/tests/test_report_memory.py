"""The live-memory timeline of the trace report (thunderlite/report/memory.py):
hand-built traces with known sizes give known peaks, and the jit's own final
traces agree with sizes computed by hand."""
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.report.memory import live_memory, tensor_bytes
from thunderlite.transforms.del_last_used import del_last_used


def _trace(build, *arg_specs):
    """A trace whose arguments are ``arg_specs`` ((name, shape, dtype)...), body ``build(*args)``,
    with ``del`` statements inserted by the real pass."""
    trc = Trace()
    with tracectx(trc):
        args = [TensorProxy(shape, dtype=dt, name=trc.claim_name(n)) for n, shape, dt in arg_specs]
        trc.args = args
        trc.set_return(build(*args))
    return del_last_used(trc)


def _series(tl):
    return [p.live_bytes for p in tl.points]


def test_tensor_bytes_follow_shape_and_dtype():
    assert tensor_bytes(TensorProxy((10, 10), dtype=torch.float32, name="a")) == 400
    assert tensor_bytes(TensorProxy((3,), dtype=torch.float64, name="b")) == 24
    assert tensor_bytes(TensorProxy((7,), dtype=torch.bool, name="c")) == 7
    assert tensor_bytes(TensorProxy((2, 2), dtype=torch.bfloat16, name="d")) == 8
    assert tensor_bytes(TensorProxy((), dtype=torch.complex64, name="e")) == 8


def test_chain_frees_each_intermediate_after_its_last_use():
    # b = sin(a) 4000 B; c = cos(b) 4000 B, then b dies; e = exp(c), then c dies
    def body(a):
        return prims.exp(prims.cos(prims.sin(a)))
    tl = live_memory(_trace(body, ("a", (1000,), torch.float32)))
    assert tl.input_bytes == 4000
    assert _series(tl) == [4000, 8000, 8000]
    assert tl.peak_bytes == 8000
    assert tl.end_bytes == 4000                 # only the returned tensor is left
    assert [name for name, _ in tl.live_at_peak] == ["t0", "t1"]


def test_peak_names_the_symbol_and_the_live_tensors():
    # a wide float64 temporary next to a small float32 one: the peak is where both live
    def body(a):
        wide = prims.convert_element_type(a, torch.float64)     # 800 B
        small = prims.sum(wide, (0,))                          # 8 B, wide dies after
        return prims.mul(small, small)                          # 8 B
    trc = _trace(body, ("a", (100,), torch.float32))
    tl = live_memory(trc)
    assert _series(tl) == [800, 808, 16]
    assert tl.peak_bytes == 808
    assert trc.bound_symbols[tl.peak_index].sym is prims.sum
    assert tl.live_at_peak == [("t0", 800), ("t1", 8)]


def test_views_share_their_base_buffer_until_every_name_is_deleted():
    # v is a view of b: no new bytes, and b's buffer lives as long as v does
    def body(a):
        b = prims.sin(a)                      # 400 B
        v = prims.reshape(b, (10, 10))        # view: 0 B
        c = prims.cos(a)                      # 400 B, b's name is dead but v keeps the buffer
        return prims.add(v, prims.reshape(c, (10, 10)))      # 400 B
    tl = live_memory(_trace(body, ("a", (100,), torch.float32)))
    assert _series(tl) == [400, 400, 800, 800, 1200]
    assert tl.peak_bytes == 1200
    assert tl.end_bytes == 400


def test_views_of_inputs_and_writes_into_inputs_allocate_nothing():
    def body(a, b):
        v = prims.reshape(a, (4, 4))                        # a view of the caller's tensor
        w = prims.copy_(prims.reshape(b, (4, 4)), v)        # writes through the view
        return w
    tl = live_memory(_trace(body, ("a", (16,), torch.float32), ("b", (16,), torch.float32)))
    assert tl.input_bytes == 128
    assert _series(tl) == [0, 0, 0]
    assert tl.peak_bytes == 0 and tl.end_bytes == 0


def test_in_place_result_names_the_written_buffer():
    def body(a):
        t = prims.sin(a)                       # 64 B
        t2 = prims.copy_(prims.cos(a), t)      # cos 64 B; t2 names t's buffer
        return t2
    tl = live_memory(_trace(body, ("a", (16,), torch.float32)))
    assert _series(tl) == [64, 128, 128]
    assert tl.end_bytes == 64


def test_trace_without_del_keeps_everything_alive():
    trc = Trace()
    with tracectx(trc):
        a = TensorProxy((10,), name="a")
        trc.args = [a]
        trc.set_return(prims.sin(prims.sin(a)))
    tl = live_memory(trc)
    assert _series(tl) == [40, 80]
    assert tl.end_bytes == 80


def test_jitted_function_final_trace():
    # (x + 1) * 2 then sum: before reuse_buffers two 1 KiB temporaries are alive
    # together at the mul; after it the mul writes into the add's dying buffer
    jf = thunderlite.jit(lambda x: ((x + 1) * 2).sum())
    jf(torch.randn(256))
    traces = thunderlite.last_traces(jf)
    assert traces[-1].stage == "reuse_buffers"
    before, final = live_memory(traces[-2]), live_memory(traces[-1])
    assert before.input_bytes == final.input_bytes == 1024
    assert before.peak_bytes == 2048
    assert final.peak_bytes == 1024 + 4
    assert before.end_bytes == final.end_bytes == 4


def test_forward_keeps_saved_tensors_alive_and_backward_frees_them():
    w = torch.randn(64, 64, requires_grad=True)
    jf = thunderlite.jit(lambda x: torch.tanh(x @ w).sum())
    jf(torch.randn(8, 64)).backward()
    fw = live_memory(thunderlite.last_traces(jf)[-1])
    bw = live_memory(thunderlite.last_backward_traces(jf)[-1])
    # tanh's output (8x64 f32 = 2 KiB) is saved for backward and the loss is returned
    assert fw.end_bytes == 2048 + 4
    # tanh writes into the buffer of x @ w, which dies there: 2 KiB, then the loss
    assert fw.peak_bytes == 2048 + 4
    # backward returns the grad of w (64x64 f32 = 16 KiB) and holds at least that at its peak
    assert bw.end_bytes == 64 * 64 * 4
    assert bw.peak_bytes >= 64 * 64 * 4


def test_chart_scale_and_byte_labels():
    from thunderlite.report.chart import human_bytes, nice_top
    assert human_bytes(900) == "900 B" and human_bytes(1536) == "1.5 KiB" and human_bytes(2 ** 20) == "1 MiB"
    assert nice_top(1.8 * 2 ** 20) == 2 * 2 ** 20          # 1.8 MiB peak: the axis tops at 2 MiB
    assert nice_top(900) == 1000 and nice_top(5000) == 5 * 1024
    assert nice_top(0) == 1.0


def test_expanded_view_allocates_nothing_and_an_opaque_multi_input_result_does():
    # broadcast_in_dim (expand) is a view even though it is larger than its base
    def body(a, b):
        e = prims.broadcast_in_dim(prims.sin(a), (4, 8), (1,))     # sin: 32 B; the expand: 0 B
        return prims.add(e, b)                                      # 128 B
    tl = live_memory(_trace(body, ("a", (8,), torch.float32), ("b", (4, 8), torch.float32)))
    assert _series(tl) == [32, 32, 160]
    # a leaf nothing can see into "may alias" both its inputs: for the estimate it is new memory
    mystery = Symbol("mystery", meta=lambda x, y: x.replace(), impl=lambda x, y: x + y, module="userex")
    tl = live_memory(_trace(lambda a, b: mystery(a, b), ("a", (8,), torch.float32), ("b", (8,), torch.float32)))
    assert _series(tl) == [32]
