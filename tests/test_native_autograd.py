"""The native recorder's unboxed autograd passthrough changes nothing PyTorch does.

PyTorch runs its boxed autograd fallback for every c10d op; the native recorder replaces it, for
the ops whose C++ signature it knows, with a kernel that redispatches below autograd without
boxing when no tensor argument requires grad and runs PyTorch's fallback itself otherwise. The
oracle is PyTorch without meshprof, in the same kind of 2-rank gloo job: tensors' values, their
``requires_grad`` and ``grad_fn``, gradients, the warnings PyTorch emits (the fallback's "not
registered to the Autograd key" warning in backward), the errors it raises, what a
TorchDispatchMode sees — and meshprof records every op once either way.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks
from native_helpers import require_native


def _scenarios(rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    out: dict[str, Any] = {}

    def caught(fn: Any) -> dict[str, Any]:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                res = fn()
                err = ""
            except Exception as e:  # the error itself is compared
                res, err = None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        msgs = sorted({str(x.message).splitlines()[0][:80] for x in w})
        return {"result": res, "error": err, "warnings": msgs}

    # 1. a plain tensor: the fast path
    def plain() -> Any:
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        return [t.tolist(), t.requires_grad, t.grad_fn is None]

    out["plain"] = caught(plain)

    # 2. a leaf that requires grad, in grad mode: PyTorch's fallback runs (whatever it does)
    def leaf() -> Any:
        x = torch.ones(3, requires_grad=True)
        dist.all_reduce(x)
        return [x.detach().tolist(), x.requires_grad, type(x.grad_fn).__name__]

    out["leaf"] = caught(leaf)

    # 3. a non-leaf that requires grad, then backward through it: the fallback's warning hooks
    def nonleaf() -> Any:
        x = torch.ones(3, requires_grad=True)
        y = x * (rank + 2)
        dist.all_reduce(y)
        y.sum().backward()
        return [y.detach().tolist(), x.grad.tolist() if x.grad is not None else None]

    out["nonleaf"] = caught(nonleaf)

    # 4. the same under no_grad, and a list collective with one tensor requiring grad
    def nograd() -> Any:
        x = torch.ones(3, requires_grad=True)
        with torch.no_grad():
            y = x * 3
            dist.all_reduce(y)
            outs = [torch.zeros(3) for _ in range(2)]
            dist.all_gather(outs, x)
        return [y.tolist(), y.requires_grad, [o.tolist() for o in outs]]

    out["nograd"] = caught(nograd)

    def gather_grad() -> Any:
        x = torch.ones(2, requires_grad=True) * (rank + 1)
        outs = [torch.zeros(2) for _ in range(2)]
        dist.all_gather(outs, x)
        return [[o.tolist() for o in outs], [o.requires_grad for o in outs]]

    out["gather_grad"] = caught(gather_grad)

    # 5. inference tensors have no autograd key: only the BackendSelect kernel sees them
    def inference() -> Any:
        with torch.inference_mode():
            t = torch.ones(2) * (rank + 1)
            dist.all_reduce(t)
            return t.tolist()

    out["inference"] = caught(inference)

    # 6. what a TorchDispatchMode sees of c10d ops (the Python key lies below autograd)
    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if "c10d" in str(func):
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def mode() -> Any:
        seen = Seen()
        t = torch.ones(2)
        with seen:
            dist.all_reduce(t)
            dist.broadcast(t, 0)
        return [seen.ops, t.tolist()]

    out["mode"] = caught(mode)

    # 7. an error from the backend reaches the caller unchanged
    def bad() -> Any:
        dist.all_gather([torch.zeros(2)] * 3, torch.ones(2))

    out["bad"] = caught(bad)
    dist.barrier()
    return out


def _worker(rank: int, ws: int, with_meshprof: bool) -> dict[str, Any]:
    import meshprof

    prof = meshprof.enable() if with_meshprof else None
    out = _scenarios(rank)
    if prof is not None:
        from meshprof.comm.native_ext import load

        prof.flush()
        out["recorded"] = sorted({e.op for e in prof.events()})
        out["count"] = len(prof.events())
        out["backend"] = prof.backend_name
        out["autograd_ops"] = sorted(load().autograd_ops())
        out["internal_errors"] = prof.internal_errors
    return out


@pytest.mark.parametrize("autograd", ["1", "0"], ids=["passthrough", "torch-fallback"])
def test_passthrough_changes_nothing_pytorch_does(autograd: str) -> None:
    require_native()
    env = {"MESHPROF_NATIVE": "1", "MESHPROF_NATIVE_AUTOGRAD": autograd}
    plain = run_ranks(_worker, 2, (False,), timeout=120, env=env)
    got = run_ranks(_worker, 2, (True,), timeout=120, env=env)
    for rank in range(2):
        g = dict(got[rank])
        assert g.pop("backend") == "native"
        assert g.pop("internal_errors") == 0
        ag = g.pop("autograd_ops")
        assert (len(ag) == 20) == (autograd == "1"), ag
        assert len(ag) in (0, 20)
        recorded, count = g.pop("recorded"), g.pop("count")
        assert recorded == ["all_gather", "all_reduce", "barrier", "broadcast"]
        # plain 1, leaf 1, nonleaf 1, nograd 2, gather_grad 1, inference 1, mode 2, bad 1, barrier
        assert count == 11
        for name, want in plain[rank].items():
            assert g[name] == want, (name, g[name], want)
    # the scenarios did what they are meant to exercise (PyTorch's own behaviour)
    ref = plain[0]
    assert ref["plain"]["result"][0] == [3.0] * 4
    assert any("autograd kernel was not registered" in w for w in ref["nonleaf"]["warnings"])
    assert ref["mode"]["result"][0] and ref["bad"]["error"]
