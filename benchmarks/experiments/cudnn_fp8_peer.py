"""cuDNN's fp8 (e4m3) attention forward as a peer of ours (issue #13's fp8 target): SDPA through the
cuDNN frontend's graph API (`graph.sdpa_fp8`, the nvidia-cudnn-frontend wheel; PyTorch's SDPA takes no
fp8 inputs), run on the cuDNN library torch loaded. The graph asks for O in e4m3 (cuDNN frontend
users' code reads bf16 O as Blackwell-only; not tried here), so this peer writes half the output bytes
ours does; its descales are one scalar per
tensor where ours are per (batch, KV head). P is scaled by 2^8 into e4m3 (scale_s) and back after
P.V (descale_s), as our kernel does.

The GPU machine does not have the frontend: carry its wheel (the device README's wheel recipe,
NAME nvidia-cudnn-frontend; `import cudnn` needs none of the wheel's optional dependencies for
this graph). Without it `available()` says why and callers leave the column out.
"""

import math

import torch

try:
    import cudnn
except ImportError as error:  # the optional peer: its absence is reported, not fatal
    cudnn = None
    _UNAVAILABLE = f"cudnn frontend not importable ({error})"
else:
    _UNAVAILABLE = None

FP8 = torch.float8_e4m3fn
P_SCALE = 256.0  # 2^8: P's largest value 256 in e4m3 (max 448), as our kernel scales P


def available():
    """(True, None) where the frontend imports, else (False, why)."""
    return (_UNAVAILABLE is None, _UNAVAILABLE)


_HANDLES = {}


def _handle():
    """One cuDNN handle per CUDA device, on torch's current stream."""
    device = torch.cuda.current_device()
    if device not in _HANDLES:
        _HANDLES[device] = cudnn.create_handle()
        cudnn.set_stream(handle=_HANDLES[device], stream=torch.cuda.current_stream().cuda_stream)
    return _HANDLES[device]


def _scalar(value, device):
    return torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=device)


class CudnnFp8Forward:
    """One cuDNN fp8 SDPA forward graph for q, k, v of (batch, seqlen, heads, headdim) e4m3 (read as
    (batch, heads, seqlen, headdim) through their strides) with scalar descales; calling it runs the
    graph and returns O, e4m3 in q's layout."""

    def __init__(self, q8, k8, v8, descales, causal):
        self.handle = _handle()
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=self.handle)
        self.out = torch.empty_like(q8)
        device = q8.device
        q_descale, k_descale, v_descale = (_scalar(float(d), device) for d in descales)
        self.buffers = [q8, k8, v8, q_descale, k_descale, v_descale, _scalar(1.0 / P_SCALE, device),
                        _scalar(P_SCALE, device), _scalar(1.0, device)]
        tensors = [graph.tensor(dim=self._bhsd(t.shape), stride=self._bhsd(t.stride()), data_type=e4m3)
                   for t in self.buffers[:3]]
        tensors += [graph.tensor(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32) for _ in self.buffers[3:]]
        q, k, v, dq, dk, dv, ds, ss, so = tensors
        o, _, amax_s, amax_o = graph.sdpa_fp8(q=q, k=k, v=v, descale_q=dq, descale_k=dk, descale_v=dv,
                                              descale_s=ds, scale_s=ss, scale_o=so, is_inference=True,
                                              attn_scale=1.0 / math.sqrt(q8.shape[-1]), use_causal_mask=causal)
        o.set_output(True).set_dim(self._bhsd(self.out.shape)).set_stride(self._bhsd(self.out.stride()))
        o.set_data_type(e4m3)
        self.amax = [torch.empty((1, 1, 1, 1), dtype=torch.float32, device=device) for _ in range(2)]
        for node in (amax_s, amax_o):
            node.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self.graph = graph
        self.variant_pack = dict(zip(tensors + [o, amax_s, amax_o], self.buffers + [self.out] + self.amax))
        self.workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=device)

    @staticmethod
    def _bhsd(sizes):
        """(batch, seqlen, heads, headdim) sizes or strides in cuDNN's (batch, heads, seqlen, headdim) order."""
        return (sizes[0], sizes[2], sizes[1], sizes[3])

    def __call__(self):
        self.graph.execute(self.variant_pack, self.workspace, handle=self.handle)
        return self.out


def forward_or_none(q, k, v, causal):
    """A CudnnFp8Forward of q, k, v (16-bit, quantized here per tensor), or None where the peer is
    unavailable or its graph cannot be built; a build failure is reported once and turns the peer off
    (available() then says why), so that every table row has the same columns."""
    global _UNAVAILABLE
    if _UNAVAILABLE is not None:
        return None
    quantized = [per_tensor_quantize(x) for x in (q, k, v)]
    try:
        return CudnnFp8Forward(*(x for x, _ in quantized), [d for _, d in quantized], causal)
    except Exception as error:  # the frontend's errors have no common base class
        _UNAVAILABLE = f"cuDNN fp8 graph not built: {type(error).__name__}: {error}"
        print(_UNAVAILABLE, flush=True)
        return None


def per_tensor_quantize(x):
    """(e4m3 x, its float descale): one scale for the whole tensor, the form cuDNN's fp8 graph takes."""
    descale = max(x.float().abs().amax().item(), 1e-12) / torch.finfo(FP8).max
    return (x.float() / descale).to(FP8), descale
