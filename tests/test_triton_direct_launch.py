"""flash_attn/triton/direct_launch.py's BoundLaunch against a stand-in of Triton's JIT (no GPU, no
compilation): which calls it launches directly and with what, and which it leaves to the JIT. The
real launches are tested on the GPU by test_triton_backend.py's
test_cached_plans_launch_directly_and_stay_correct."""

import inspect
import types

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")
from flash_attn.triton import direct_launch  # noqa: E402 - after the skip above

FUNCTION, METADATA, STREAM = "function handle", "packed metadata", "stream 7"


def _param(name, constexpr=False, default=inspect.Parameter.empty):
    return types.SimpleNamespace(name=name, is_constexpr=constexpr, default=default)


class _Compiled:
    """A CompiledKernel's stand-in: run is the launcher, recording its arguments."""

    def __init__(self, launches):
        self.run = lambda *arguments: launches.append(("direct", arguments))
        self.function, self.packed_metadata = FUNCTION, METADATA


class _Kernel:
    """A JITFunction's stand-in with parameters (X, n, scale, BLOCK: constexpr, FLAG: constexpr = True):
    kernel[grid](*args, **options) records the launch and returns a _Compiled (None: the interpreter)."""

    def __init__(self, compiles=True):
        self.params = [_param("X"), _param("n"), _param("scale"), _param("BLOCK", True),
                       _param("FLAG", True, default=True)]
        self.launches, self.compiles = [], compiles

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.launches.append(("jit", args, options))
            return _Compiled(self.launches) if self.compiles else None
        return launch


@pytest.fixture(autouse=True)
def _one_device(monkeypatch):
    """A current device 0 with stream STREAM and no launch hooks, as the direct path asks of Triton."""
    monkeypatch.setattr(direct_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(direct_launch, "_current_stream", lambda device: STREAM)
    monkeypatch.setattr(direct_launch, "_hooks_unset", lambda: True)


def _grid(meta):
    return (meta["n"] // meta["BLOCK"], 2)


def test_later_calls_launch_the_compiled_kernel_directly():
    kernel, bound = _Kernel(), direct_launch.BoundLaunch()
    x = torch.zeros(64)
    bound(kernel, _grid, (x, 256, 0.5), {"BLOCK": 64, "num_warps": 4})
    bound(kernel, _grid, (x + 1, 256, 0.25), {"BLOCK": 64, "num_warps": 4})
    assert [launch[0] for launch in kernel.launches] == ["jit", "direct"]
    arguments = kernel.launches[1][1]
    assert arguments[:9] == (4, 2, 1, STREAM, FUNCTION, METADATA, None, None, None)  # grid (256 / 64, 2, 1)
    assert torch.equal(arguments[9], x + 1) and arguments[10:] == (256, 0.25, 64, True)  # BLOCK, FLAG's default
    assert bound.direct_launches == 1


@pytest.mark.parametrize("change", ["misaligned tensor", "other dtype", "other int", "int for a float",
                                    "other device", "hook set"])
def test_a_changed_fact_goes_through_the_jit(monkeypatch, change):
    kernel, bound = _Kernel(), direct_launch.BoundLaunch()
    x = torch.zeros(64)
    bound(kernel, _grid, (x, 256, 0.5), {"BLOCK": 64})
    args = {"misaligned tensor": (x[1:], 256, 0.5), "other dtype": (x.double(), 256, 0.5),
            "other int": (x, 512, 0.5), "int for a float": (x, 256, 1)}.get(change, (x, 256, 0.5))
    if change == "other device":
        monkeypatch.setattr(direct_launch, "_current_device", lambda: 1)
    if change == "hook set":
        monkeypatch.setattr(direct_launch, "_hooks_unset", lambda: False)
    bound(kernel, _grid, args, {"BLOCK": 64})
    assert [launch[0] for launch in kernel.launches] == ["jit", "jit"]
    assert bound.direct_launches == 0


def test_no_compiled_kernel_no_direct_launch():
    """Triton's interpreter returns no compiled kernel: every launch goes through it."""
    kernel, bound = _Kernel(compiles=False), direct_launch.BoundLaunch()
    for _ in range(3):
        bound(kernel, _grid, (torch.zeros(64), 256, 0.5), {"BLOCK": 64})
    assert [launch[0] for launch in kernel.launches] == ["jit"] * 3


def test_a_constexpr_among_the_arguments_is_not_captured():
    kernel, bound = _Kernel(), direct_launch.BoundLaunch()
    kernel.params[1] = _param("n", True)
    for _ in range(2):
        bound(kernel, _grid, (torch.zeros(64), 256, 0.5), {"BLOCK": 64})
    assert [launch[0] for launch in kernel.launches] == ["jit", "jit"]


def test_a_missing_constexpr_is_not_captured():
    """A constexpr neither given nor defaulted: the JIT's error is the caller's, nothing is kept."""
    kernel, bound = _Kernel(), direct_launch.BoundLaunch()
    for _ in range(2):
        bound(kernel, _grid, (torch.zeros(64), 256, 0.5), {"num_warps": 4})
    assert [launch[0] for launch in kernel.launches] == ["jit", "jit"]


def test_launch_hooks_are_seen_as_set_only_with_a_function(monkeypatch):
    """Against this Triton's own knobs: empty hook chains (3.6 and later) or None count as unset."""
    knobs = pytest.importorskip("triton.knobs")
    monkeypatch.undo()  # the real _hooks_unset, not the fixture's
    assert direct_launch._hooks_unset()
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):
        hook.add(print)
        try:
            assert not direct_launch._hooks_unset()
        finally:
            hook.remove(print)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", print)
        assert not direct_launch._hooks_unset()
        monkeypatch.undo()
    assert direct_launch._hooks_unset()


def test_capture_is_tried_on_the_first_call_only():
    """A launch that could not be captured on its first call stays with the JIT (no retry a call)."""
    kernel, bound = _Kernel(compiles=False), direct_launch.BoundLaunch()
    bound(kernel, _grid, (torch.zeros(64), 256, 0.5), {"BLOCK": 64})
    kernel.compiles = True
    for _ in range(2):
        bound(kernel, _grid, (torch.zeros(64), 256, 0.5), {"BLOCK": 64})
    assert [launch[0] for launch in kernel.launches] == ["jit"] * 3


def test_launch_kernel_without_a_bound_launch_goes_through_the_jit():
    kernel = _Kernel()
    for _ in range(2):
        direct_launch.launch_kernel(kernel, _grid, (torch.zeros(64), 256, 0.5), {"BLOCK": 64})
    assert [launch[0] for launch in kernel.launches] == ["jit", "jit"]
