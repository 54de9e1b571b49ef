"""Launches of a Triton kernel that skip the JIT's per-call dispatch (issue #9).

kernel[grid](*args, **options) took 35-104 µs of host time a launch on the GPU machine, of which the
compiled kernel's launcher was 9-18 µs (benchmarks/NOTES.md v44 item 4): the rest is the JIT
specializing every argument, rebuilding its cache key and reading its settings, the same work for
every call of a cached launch plan (attention.py). A BoundLaunch, held by one plan for one of its
kernels, keeps the compiled kernel the JIT returned for the plan's first call and launches it
directly afterwards while everything the JIT chose it by still holds: each tensor argument's dtype
and 16-byte alignment, each host-made tensor descriptor's dtype, shape, strides and block shape, the
value of every other argument but the floats (which the JIT types as fp32
whatever their value), the current device, and no launch hook (a profiler's) being set. Otherwise,
in Triton's interpreter, and on a Triton whose CompiledKernel lacks the launcher this was written
against (run(grid x, y, z, stream, function, packed metadata, launch metadata, enter hook, exit
hook, *every parameter's value), as Triton 3.6's JIT calls it, run on the GPU machine; Triton 3.9's
source calls it the same way, not run on a GPU), the launch goes through the JIT.

Not rechecked on the direct path: the JIT's check that a global the kernel read has not changed
since it compiled (the kernels read module constants only) and TRITON_DEBUG / instrumentation
settings changed mid-process (attention's plan key holds TRITON_DEBUG).
"""

import inspect

import torch

try:
    from triton import knobs
except ImportError:  # a Triton without knobs (before 3.4) launches through the JIT only
    knobs = None
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None


def _current_device():
    from triton.runtime import driver
    return driver.active.get_current_device()


def _current_stream(device):
    from triton.runtime import driver
    return driver.active.get_current_stream(device)


def _hooks_unset():
    """Whether no launch hook is set: the launcher then skips them given None. Triton 3.6 / 3.9 keep
    them as HookChains, set once a function is added to one (launch_metadata's `is None` test never
    holds there); earlier knobs hold a function or None."""
    return all(hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def _is_descriptor(arg):
    return TensorDescriptor is not None and isinstance(arg, TensorDescriptor)


def launch_kernel(kernel, grid, args, options, bound=None):
    """kernel[grid](*args, **options), through `bound` (a BoundLaunch) where the caller has one."""
    if bound is None:
        kernel[grid](*args, **options)
    else:
        bound(kernel, grid, args, options)


class BoundLaunch:
    """One kernel launch of a plan: through the JIT the first time (and whenever a fact it was chosen
    by differs), directly afterwards. `direct_launches` counts the direct ones (for tests)."""

    def __init__(self):
        self.launcher = None  # the compiled kernel's launcher, once captured
        self.first_call = True  # capture is tried on the first call only
        self.direct_launches = 0

    def __call__(self, kernel, grid, args, options):
        """kernel[grid](*args, **options): args the kernel's leading parameters, options its
        remaining ones (constexprs) and the launch options (num_warps, num_stages, maxnreg)."""
        if self.launcher is not None and self._holds(args):
            device = _current_device()
            if device == self.device and _hooks_unset():
                self.launcher(*self.grid, _current_stream(device), self.function, self.metadata, None, None, None,
                              *args, *self.tail)
                self.direct_launches += 1
                return
        compiled = kernel[grid](*args, **options)
        if self.first_call:
            self.first_call = False
            self._capture(kernel, compiled, grid, args, options)

    def _facts(self, args):
        """What the JIT specialized the call's arguments on, but the floats; of a host-made tensor
        descriptor, everything but its base's address (the launcher encodes the descriptor each call)."""
        tensors = tuple((args[i].dtype, args[i].data_ptr() % 16 == 0) for i in self.tensor_positions)
        descriptors = tuple((d.base.dtype, tuple(d.shape), tuple(d.strides), tuple(d.block_shape), d.padding)
                            for d in (args[i] for i in self.descriptor_positions))
        return tensors, descriptors, tuple(args[i] for i in self.value_positions)

    def _holds(self, args):
        return (len(args) == self.arity and all(type(args[i]) is float for i in self.float_positions)
                and self._facts(args) == self.facts)

    def _capture(self, kernel, compiled, grid, args, options):
        """Keeps what a direct launch of `compiled` needs, where this Triton has it; else nothing (every
        launch then goes through the JIT)."""
        params = getattr(kernel, "params", None)
        run, function = getattr(compiled, "run", None), getattr(compiled, "function", None)
        metadata = getattr(compiled, "packed_metadata", None)
        if knobs is None or params is None or run is None or function is None or metadata is None:
            return
        if len(args) > len(params) or any(param.is_constexpr for param in params[:len(args)]):
            return
        tail = []
        for param in params[len(args):]:
            if param.name in options:
                tail.append(options[param.name])
            elif getattr(param, "default", inspect.Parameter.empty) is not inspect.Parameter.empty:
                tail.append(param.default)
            else:
                return
        self.tail = tuple(tail)
        self.arity = len(args)
        self.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.float_positions = [i for i, a in enumerate(args) if type(a) is float]
        self.descriptor_positions = [i for i, a in enumerate(args) if _is_descriptor(a)]
        self.value_positions = [i for i, a in enumerate(args)
                                if not isinstance(a, torch.Tensor) and type(a) is not float and not _is_descriptor(a)]
        self.facts = self._facts(args)
        if callable(grid):
            grid = grid(dict(zip((param.name for param in params), (*args, *self.tail))))
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.device = _current_device()
        self.function, self.metadata, self.launcher = function, metadata, run
