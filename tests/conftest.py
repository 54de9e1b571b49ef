"""Shared fixtures: a per-test seed for every test, and the setup every GPU test module uses."""

import os
import sys
import zlib

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # `import helpers` under any pytest import mode

# Without a GPU, Triton kernels (flash_attn/triton) run in Triton's interpreter; it must be chosen
# before triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Seed torch (CPU and CUDA) from the test's id, so each case has its own reproducible inputs."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    return seed


@pytest.fixture
def cuda_test_setup(monkeypatch):
    """For GPU test modules (pytestmark usefixtures): the CUDA ops fill every output with NaN before
    their kernels run, so an element a kernel never writes fails the test; and fp32 matmuls in the
    reference use full fp32 (no TF32), so the reference is the fp32 math the rule assumes. With
    FLASH_ATTN_TEST_BACKEND=triton (helpers.py) the public functions run the Triton backend, whose
    outputs are poisoned the same way (flash_attn/triton/poison.py)."""
    import flash_attn.ops
    from helpers import TEST_BACKEND

    if TEST_BACKEND == "triton":
        monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
        from flash_attn.triton import poison

        previous_triton_poison = poison.set_poison_outputs(True)
    previous_poison = flash_attn.ops.set_poison_outputs(True) if flash_attn.ops.has_cuda_kernels() else None
    previous_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous_precision)
    if previous_poison is not None:
        flash_attn.ops.set_poison_outputs(previous_poison)
    if TEST_BACKEND == "triton":
        poison.set_poison_outputs(previous_triton_poison)
