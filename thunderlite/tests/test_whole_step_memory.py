"""What a whole training step keeps alive: norm outputs recomputed in the
backward (autodiff/rematerialize.py, ``norms``), cross entropy's
log-probabilities written into the dying logits and broadcasting elementwise
calls into a dying operand (transforms/reuse_buffers.py), an optimizer's
per-parameter 0-d arithmetic batched (whole_step.batch_scalar_chains).
Results equal eager's."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite
from thunderlite.report.memory import live_memory
from thunderlite.tests.whole_step_util import run_both


class NormNet(nn.Module):
    def __init__(self, norm: type = nn.LayerNorm):
        super().__init__()
        self.inp, self.norm, self.head = nn.Linear(4, 16), norm(16), nn.Linear(16, 5)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.norm(self.inp(x).tanh())), y)


def step(model, opt, x, y):
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _adamw(ps):
    return torch.optim.AdamW(ps, lr=1e-2)


def _args():
    torch.manual_seed(1)
    return torch.randn(6, 4), torch.randint(0, 5, (6,))


def _calls(trace, name: str) -> list[int]:
    return [i for i, b in enumerate(trace.bound_symbols) if b.sym.name == name]


def test_layer_norm_output_is_recomputed_in_the_backward():
    torch.manual_seed(0)
    jstep, _, _, _ = run_both(step, _adamw, model=NormNet(), args=_args())
    final = thunderlite.last_traces(jstep)[-1]
    norms, loss = _calls(final, "native_layer_norm"), _calls(final, "cross_entropy_forward")
    assert len(norms) == 2 and norms[0] < loss[0] < norms[1]     # once in the forward, again in the backward
    first = final.bound_symbols[norms[0]].output[0].name
    alive = {n for n, _ in live_memory(final).live_at_peak}
    assert first not in alive
    dels = [i for i, b in enumerate(final.bound_symbols) if b.sym.name == "del" and
            any(getattr(a, "name", None) == first for a in b.args)]
    assert dels and dels[0] < loss[0]          # the forward's output dies at the head's matmul


def test_rms_norm_output_is_recomputed_too():
    torch.manual_seed(0)
    jstep, _, _, _ = run_both(step, _adamw, model=NormNet(nn.RMSNorm), args=_args())
    final = thunderlite.last_traces(jstep)[-1]
    norms, loss = _calls(final, "fused_rms_norm"), _calls(final, "cross_entropy_forward")
    assert len(norms) == 2 and norms[0] < loss[0] < norms[1]


def test_the_model_alone_still_saves_the_norm_output():
    """Outside a whole step (PyTorch runs the backward) the norm is not recomputed."""
    torch.manual_seed(0)
    model = NormNet()
    jm = thunderlite.jit(model)
    jm(*_args()).backward()
    assert len(_calls(thunderlite.last_backward_traces(jm)[-1], "native_layer_norm")) == 0


def test_cross_entropy_writes_log_probabilities_into_the_logits():
    torch.manual_seed(0)
    jstep, _, _, _ = run_both(step, _adamw, model=NormNet(), args=_args())
    final = thunderlite.last_traces(jstep)[-1]
    (ce,) = _calls(final, "cross_entropy_forward")
    b = final.bound_symbols[ce]
    assert b.kwargs.get("out") is not None and b.kwargs["out"].name == b.args[0].name
    points = {pt.index: pt.live_bytes for pt in live_memory(final).points}
    before = max(i for i in points if i < ce)
    assert points[ce] - points[before] < 6 * 5 * 4      # no new buffer of the logits' size


def test_cross_entropy_keeps_logits_that_are_read_later():
    def step_logits(model, opt, x, y):
        logits = model.head(model.norm(model.inp(x).tanh()))
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach(), logits.detach()            # the caller gets the logits
    torch.manual_seed(0)
    jstep, _, _, _ = run_both(step_logits, _adamw, model=NormNet(), args=_args())
    final = thunderlite.last_traces(jstep)[-1]
    (ce,) = _calls(final, "cross_entropy_forward")
    assert "out" not in final.bound_symbols[ce].kwargs


def test_broadcasting_division_writes_into_its_dying_operand():
    def f(x, s):
        return (x.sqrt() / s).add(1e-8)
    x, s = torch.rand(8, 16), torch.tensor(2.0)
    jf = thunderlite.jit(f)
    torch.testing.assert_close(jf(x, s), f(x, s))
    final = thunderlite.last_traces(jf)[-1]
    (div,) = _calls(final, "div")
    b = final.bound_symbols[div]
    assert b.kwargs.get("out") is not None and b.kwargs["out"].name == b.args[0].name
    assert live_memory(final).peak_bytes == 8 * 16 * 4     # one buffer for sqrt, div and add


def test_adamw_bias_corrections_are_computed_once_for_all_parameters():
    """``batch_scalar_chains``: the per-parameter 0-d arithmetic of AdamW's
    compiling path runs once on the stacked step counts; the chain that reads
    the learning rate, once per parameter group. Optimizer state equals eager's."""
    def adamw_groups(ps):
        ps = list(ps)
        return torch.optim.AdamW([{"params": ps[:3]}, {"params": ps[3:], "lr": 5e-3}], lr=1e-2)
    torch.manual_seed(0)
    jstep, _, _, _ = run_both(step, adamw_groups, model=NormNet(), args=_args())
    final = thunderlite.last_traces(jstep)[-1]
    assert "batch_scalar_chains" in [t.stage for t in thunderlite.last_traces(jstep)]
    pows = [final.bound_symbols[i] for i in _calls(final, "pow")]
    assert pows and all(b.output.shape != () for b in pows)        # none per parameter
    stacks, unbinds = _calls(final, "stack"), _calls(final, "unbind")
    assert len(stacks) == len(unbinds) == 3
    # v's correction (no lr in it) once for all 6 parameters; the step size (times lr) once per group
    assert sorted(final.bound_symbols[i].output.shape[0] for i in stacks) == [3, 3, 6]


def test_two_optimizer_steps_in_one_program_match_eager():
    """The step counts are written twice: what the first step's corrections
    read must be computed before the second increment."""
    def two_steps(model, opt, x, y):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    torch.manual_seed(0)
    run_both(two_steps, _adamw, model=NormNet(), args=_args())
