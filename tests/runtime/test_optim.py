"""LeanAdam: the fused Adam's updates bit for bit, through the lean step where it applies and
through Adam.step where it does not (CPU: PyTorch's fused Adam runs on the CPU too)."""
import pytest
import torch

from sparsegnn.optim import LeanAdam


def _models(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(dtype)
    b = torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


def _run(model, opt, steps, x, skip=None, change_lr_at=None):
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        if skip is not None:
            skip.grad = None          # a parameter without a gradient this step: Adam leaves it alone
        if change_lr_at == i:
            for g in opt.param_groups:
                g["lr"] *= 0.5
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _count_full_steps(monkeypatch):
    """Count the calls that go through Adam.step (the fallback), not the lean path."""
    import sparsegnn.optim as optim

    calls = []
    real = optim._adam_step

    def counted(opt, closure):
        calls.append(1)
        return real(opt, closure)

    monkeypatch.setattr(optim, "_adam_step", counted)
    return calls


@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 5e-3}, {"maximize": True, "betas": (0.8, 0.95)},
                                    {"eps": 1e-3, "weight_decay": 1e-2}])
def test_lean_steps_equal_fused_adam_bit_for_bit(kwargs, monkeypatch):
    a, b = _models()
    x = torch.randn(11, 7)
    calls = _count_full_steps(monkeypatch)
    lean = LeanAdam(a.parameters(), lr=0.03, **kwargs)
    ref = torch.optim.Adam(b.parameters(), lr=0.03, fused=True, **kwargs)
    start = [p.detach().clone() for p in a.parameters()]
    got = _run(a, lean, 6, x, skip=a[2].bias, change_lr_at=3)
    want = _run(b, ref, 6, x, skip=b[2].bias, change_lr_at=3)
    assert len(calls) == 1            # the first step creates the state, the other five are lean
    assert not torch.equal(got[0], start[0])
    assert torch.equal(got[3], start[3])     # never had a gradient
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    for p, q in zip(a.parameters(), b.parameters()):
        if p.grad is not None:
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(lean.state[p][key], ref.state[q][key])


def test_lean_adam_matches_single_tensor_adam():
    """The fused kernel's update is Adam's (against the plain for-loop implementation)."""
    a, b = _models(seed=1)
    x = torch.randn(5, 7)
    got = _run(a, LeanAdam(a.parameters(), lr=0.05, weight_decay=1e-3), 4, x)
    want = _run(b, torch.optim.Adam(b.parameters(), lr=0.05, weight_decay=1e-3, foreach=False), 4, x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_groups_hooks_and_state_dict(monkeypatch):
    a, b = _models(seed=2)
    x = torch.randn(8, 7)
    groups = lambda m: [{"params": m[0].parameters(), "lr": 0.02}, {"params": m[2].parameters(), "lr": 0.07}]  # noqa: E731
    lean = LeanAdam(groups(a), lr=0.01)
    ref = torch.optim.Adam(groups(b), lr=0.01, fused=True)
    seen = []
    lean.register_step_pre_hook(lambda opt, args, kwargs: seen.append("pre"))
    lean.register_step_post_hook(lambda opt, args, kwargs: seen.append("post"))
    _run(a, lean, 3, x)
    _run(b, ref, 3, x)
    assert seen == ["pre", "post"] * 3           # once per step, also on the fallback step
    # a fresh LeanAdam loaded from the state dict continues the same run
    resumed = LeanAdam(groups(a), lr=0.01)
    resumed.load_state_dict(lean.state_dict())
    calls = _count_full_steps(monkeypatch)
    got, want = _run(a, resumed, 3, x), _run(b, ref, 3, x)
    assert calls == []
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("case", ["closure", "amsgrad", "grad_scale", "mixed_dtypes", "not_fused"])
def test_what_the_lean_step_does_not_cover_goes_through_adam_step(case, monkeypatch):
    a, b = _models(seed=3)
    x = torch.randn(6, 7)
    extra = {"amsgrad": True} if case == "amsgrad" else {"fused": False} if case == "not_fused" else {}
    if case == "mixed_dtypes":
        a[2].double()
        b[2].double()
        fwd = lambda m: m[2](m[1](m[0](x)).double())  # noqa: E731
    else:
        fwd = lambda m: m(x)  # noqa: E731
    lean = LeanAdam(a.parameters(), lr=0.04, **extra)
    ref = torch.optim.Adam(b.parameters(), lr=0.04, **({"fused": True} | extra))
    calls = _count_full_steps(monkeypatch)
    for _ in range(3):
        for m, opt in ((a, lean), (b, ref)):
            opt.zero_grad(set_to_none=True)
            if case == "closure":
                def closure(m=m):
                    loss = fwd(m).square().mean()
                    loss.backward()
                    return loss
                opt.step(closure)
            else:
                fwd(m).square().mean().backward()
                if case == "grad_scale":
                    opt.grad_scale = torch.tensor(1.0)
                opt.step()
    assert len(calls) == 3
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_zero_grad_sets_none_or_zeroes():
    a, _ = _models()
    opt = LeanAdam(a.parameters(), lr=0.01)
    a(torch.randn(4, 7)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in a.parameters())
    a(torch.randn(4, 7)).sum().backward()
    opt.zero_grad()
    assert all(p.grad is None for p in a.parameters())


def test_positional_arguments_as_adam():
    a, b = _models(seed=4)
    x = torch.randn(5, 7)
    got = _run(a, LeanAdam(a.parameters(), 0.02, (0.8, 0.9), 1e-6, 1e-3), 3, x)
    want = _run(b, torch.optim.Adam(b.parameters(), 0.02, (0.8, 0.9), 1e-6, 1e-3, fused=True), 3, x)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
