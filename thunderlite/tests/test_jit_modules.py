"""thunderlite.jit on nn.Modules: behaves like the module (parameters, buffers,
state_dict, modes, hooks), matches eager on the structures models use, and
writes module state back as eager does (issue 4)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite


def _check(module: nn.Module, *args, **kwargs):
    jm = thunderlite.jit(module)
    with torch.no_grad():
        torch.testing.assert_close(jm(*args, **kwargs), module(*args, **kwargs))
    return jm


def test_mlp_matches_and_keeps_module_surface():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    jm = _check(model, torch.randn(2, 4))
    assert list(jm.state_dict()) == list(model.state_dict())
    assert [n for n, _ in jm.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(a is b for a, b in zip(jm.parameters(), model.parameters(), strict=True))
    assert jm[0] is model[0]
    jm.eval()
    assert not model.training
    jm.train()
    assert model.training


def test_state_dict_load_changes_results():
    model = nn.Linear(3, 3)
    jm = thunderlite.jit(model)
    x = torch.randn(2, 3)
    with torch.no_grad():
        jm(x)
        jm.load_state_dict({"weight": torch.eye(3), "bias": torch.zeros(3)})
        torch.testing.assert_close(jm(x), x)


@dataclass
class Config:
    hidden: int = 8
    n_layers: int = 2
    use_bias: bool = True


class Base(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg

    def act(self, x):
        return F.gelu(x)


class Stack(Base):
    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.layers = nn.ModuleList([nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.use_bias)
                                     for _ in range(cfg.n_layers)])
        self.heads = nn.ModuleDict({"a": nn.Linear(cfg.hidden, 2), "b": nn.Linear(cfg.hidden, 3)})
        self.register_buffer("offset", torch.full((cfg.hidden,), 0.5))

    @property
    def width(self):
        return self.cfg.hidden

    def act(self, x):
        return super().act(x) * 2

    def forward(self, x, *, head="a", scale=1.0):
        assert x.shape[-1] == self.width
        for layer in self.layers:
            x = self.act(layer(x)) + self.offset
        return self.heads[head](x) * scale


def test_modulelist_moduledict_buffers_kwargs_properties_super_dataclass():
    model = Stack(Config())
    x = torch.randn(3, 8)
    jm = _check(model, x)
    with torch.no_grad():
        torch.testing.assert_close(jm(x, head="b", scale=0.5), model(x, head="b", scale=0.5))
        torch.testing.assert_close(jm(torch.randn(5, 8)).shape, torch.Size([5, 2]))


class Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.double = False

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if self.double else y


def test_changing_a_module_flag_recompiles():
    model = Flagged()
    jm = thunderlite.jit(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(jm(x), model(x))
        model.double = True
        torch.testing.assert_close(jm(x), model(x))
    assert "double" in thunderlite.cache_info(jm)["last_miss_reason"]


def test_train_eval_switch_recompiles_dropout_and_batchnorm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    jm = thunderlite.jit(model)
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    ref.load_state_dict(model.state_dict())
    model.eval()
    ref.eval()
    x = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(jm(x), ref(x))
        model.train()
        ref.train()
        model[2].p = 0.0
        ref[2].p = 0.0
        torch.testing.assert_close(jm(x), ref(x))
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
    torch.testing.assert_close(model[1].running_var, ref[1].running_var)
    assert int(model[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == 1


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))
        self.calls = 0
        self.last = None

    def forward(self, x):
        self.total.add_(x)            # in-place buffer update
        self.calls = self.calls + 1   # Python attribute write
        self.last = x * 2             # tensor attribute write
        return self.total.clone()


def test_module_state_writes_land_as_in_eager():
    model = Counter()
    jm = thunderlite.jit(model)
    x = torch.ones(3)
    jm(x)
    jm(x)
    torch.testing.assert_close(model.total, torch.full((3,), 2.0))
    assert model.calls == 2
    torch.testing.assert_close(model.last, x * 2)


def test_forward_hooks_run():
    model = nn.Linear(3, 3)
    seen = []
    model.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    jm = thunderlite.jit(model)
    with torch.no_grad():
        jm(torch.randn(2, 3))
    assert seen == [torch.Size([2, 3])]


@pytest.mark.parametrize("dynamic, misses", [(False, 3), (None, 2)])
def test_new_shapes_respecialize_module(dynamic, misses):
    """dynamic=False: each size compiles; the default makes the batch size
    symbolic after it changed once (7 reuses the entry compiled for 5)."""
    model = nn.Linear(4, 2)
    jm = thunderlite.jit(model, dynamic=dynamic)
    with torch.no_grad():
        for n in (1, 5, 5, 7):
            x = torch.randn(n, 4)
            torch.testing.assert_close(jm(x), model(x))
    info = thunderlite.cache_info(jm)
    assert info["misses"] == misses and info["hits"] == 4 - misses


def test_module_grads_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(5, 4)
    thunderlite.jit(model)(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


class Consumer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pending = torch.ones(2)
        self.log = {"a": 1}

    def forward(self, x):
        y = x + self.pending
        del self.pending
        del self.log["a"]
        self.log["b"] = 2
        return y


def test_attribute_and_item_deletion_land_as_in_eager():
    model, ref = Consumer(), Consumer()
    x = torch.randn(2)
    torch.testing.assert_close(thunderlite.jit(model)(x), ref(x))
    assert not hasattr(model, "pending") and not hasattr(ref, "pending")
    assert model.log == ref.log == {"b": 2}


def test_cnn_with_batchnorm_training_grads_and_running_stats():
    import copy
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    ref = copy.deepcopy(cnn)
    x = torch.randn(2, 3, 8, 8)
    out, expected = thunderlite.jit(cnn)(x), ref(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for p, q in zip(cnn.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(cnn[1].running_mean, ref[1].running_mean)


def test_torch_transformer_layer_and_lstm():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0).eval()
    lstm = nn.LSTM(4, 6, batch_first=True)
    x, s = torch.randn(2, 5, 16), torch.randn(2, 5, 4)
    with torch.no_grad():
        torch.testing.assert_close(thunderlite.jit(layer)(x), layer(x))
        torch.testing.assert_close(thunderlite.jit(lstm)(s)[0], lstm(s)[0])
    assert not thunderlite.examine(layer, x).opaque


def test_hooks_added_and_attributes_changed_after_compiling_are_seen():
    """The entry checks a module's hooks (none when compiled: checked by the
    dicts' truth) and its None and bool attributes (by identity): a hook added
    later, an attribute set from None and a flag flipped each reach the next call."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.scale = None
            self.double = False

        def forward(self, x):
            y = self.lin(x)
            if self.scale is not None:
                y = y * self.scale
            return y * 2 if self.double else y

    model = Scaled()
    jm = thunderlite.jit(model)
    x = torch.randn(2, 3)
    changes = [lambda: model.lin.register_forward_hook(lambda mod, inp, out: out + 1),
               lambda: model.register_forward_pre_hook(lambda mod, inp: (inp[0] * -1,)),
               lambda: setattr(model, "scale", 3.0),
               lambda: setattr(model, "double", True),
               lambda: setattr(model, "double", 1)]       # equal to True, but not a bool: not what was compiled
    with torch.no_grad():
        torch.testing.assert_close(jm(x), model(x))
        for change in changes:
            change()
            torch.testing.assert_close(jm(x), model(x))
