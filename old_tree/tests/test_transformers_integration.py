"""flash_attn.integrations.transformers: tiny randomly initialised Llama and GPT-2 models with our
attention against the same models with transformers' "sdpa" attention.

The tolerance rule of docs/TESTING.md on whole models: ref is the sdpa model in fp64, pt the sdpa
model in the test dtype (fp32 on CPU, bf16 on CUDA), ours the model in the test dtype with
attn_implementation=register(); only valid (unpadded) positions are compared. Skips without
transformers; the CUDA cases skip without a GPU and the extension.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flash_attn.integrations.transformers as integration  # noqa: E402
import flash_attn.ops  # noqa: E402
from helpers import GRAD_FACTOR, OUT_FACTOR, assert_fa_close  # noqa: E402

OURS = integration.register()
F64 = torch.float64
VOCAB = 96

_NO_GPU = not torch.cuda.is_available() or not flash_attn.ops.has_cuda_kernels()
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16",
                 marks=pytest.mark.skipif(_NO_GPU, reason="needs a CUDA GPU and the flash_attn._C extension")),
]


def tiny_model(kind):
    """A 2-layer model, random weights, no dropout: Llama with GQA (4 query heads, 2 KV heads) and
    rotary embeddings, Mistral (the same with a sliding window of 4 keys), or GPT-2 (learned
    positions, biases, MHA)."""
    if kind in ("llama", "mistral"):
        shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        if kind == "llama":
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
        return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=4, **shape))
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.0,
                                     resid_pdrop=0.0, embd_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def variant(model, implementation, dtype, device):
    """A copy of model with the given attention implementation, in dtype on device."""
    twin = copy.deepcopy(model).to(device=device, dtype=dtype)
    twin.set_attn_implementation(implementation)
    return twin


def left_padded_batch(device, valid=(10, 6, 1)):
    """input_ids (3, 10) with rows of 10, 6 and 1 valid tokens, left-padded (generation's layout),
    and the position_ids generate derives from such a mask."""
    ids = torch.randint(0, VOCAB, (len(valid), max(valid)), device=device)
    mask = torch.stack([torch.arange(max(valid), device=device) >= max(valid) - n for n in valid]).long()
    return ids, mask, positions_of(mask)


def positions_of(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.fixture
def counted(monkeypatch):
    """Counts of the integration's dense and variable-length attention calls."""
    calls = {"dense": 0, "varlen": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(integration, "flash_attn_func", counting("dense", integration.flash_attn_func))
    monkeypatch.setattr(integration, "flash_attn_varlen_func", counting("varlen", integration.flash_attn_varlen_func))
    return calls


def test_register():
    """register() returns the name models accept; a name with "flash" in it is refused (transformers
    would route it to its own FlashAttention loader)."""
    assert OURS == integration.NAME and "flash" not in OURS
    model = tiny_model("llama")
    model.set_attn_implementation(OURS)
    assert model.config._attn_implementation == OURS
    with pytest.raises(ValueError, match="flash"):
        integration.register("flash_attn_ours")


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gpt2"])
def test_logits_and_gradients(kind, padded, device, dtype, counted):
    """Forward logits and the gradients of every parameter; a padded batch runs the variable-length
    path in every layer, a full one the dense path."""
    model = tiny_model(kind)
    ids, mask, positions = left_padded_batch(device, valid=(10, 6, 1) if padded else (10, 10, 10))
    results = {}
    for name, implementation, run_dtype in (("ref", "sdpa", F64), ("pt", "sdpa", dtype), ("ours", OURS, dtype)):
        twin = variant(model, implementation, run_dtype, device)
        logits = twin(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        dlogits = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0)).to(device, run_dtype)
        grads = torch.autograd.grad(logits, list(twin.parameters()), dlogits * mask[..., None])
        results[name] = (logits.detach()[mask.bool()], dict(zip((n for n, _ in twin.named_parameters()), grads)))
    assert counted["varlen" if padded else "dense"] == 2 and counted["dense" if padded else "varlen"] == 0
    (ref, ref_grads), (pt, pt_grads), (ours, ours_grads) = results["ref"], results["pt"], results["ours"]
    assert_fa_close("logits", ours, ref, pt, OUT_FACTOR)
    for name, grad in ours_grads.items():
        assert_fa_close(name, grad, ref_grads[name], pt_grads[name], GRAD_FACTOR)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gpt2"])
def test_generate(kind, cache, padded, device, dtype, counted):
    """Greedy generate of 5 tokens with a KV cache, from a left-padded batch or a full one (whose
    mask generate drops: a static cache's unwritten tail is then cut by our mask function): the
    logits of every step match the sdpa model's full forward (no cache) over the same tokens."""
    model = tiny_model(kind)
    ids, mask, _ = left_padded_batch(device, valid=(10, 6, 1) if padded else (10, 10, 10))
    ours = variant(model, OURS, dtype, device).eval()
    options = dict(cache_implementation="static") if cache == "static" else {}
    # disable_compile: on CUDA, generate would torch.compile the static-cache decode step by itself;
    # that combination is not what this test is about (and has not been tried on a GPU yet).
    generated = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                              disable_compile=True, **options)
    assert counted["varlen"] + counted["dense"] == 5 * 2  # the prompt and 4 decode steps, 2 layers each
    sequence = generated.sequences[:, :-1]
    full_mask = torch.cat((mask, torch.ones_like(generated.sequences[:, mask.shape[1]:-1])), dim=1)
    step_logits = torch.stack(generated.logits, dim=1)
    expected = {}
    for run_dtype in (F64, dtype):
        with torch.no_grad():
            logits = variant(model, "sdpa", run_dtype, device)(
                input_ids=sequence, attention_mask=full_mask, position_ids=positions_of(full_mask)).logits
        expected[run_dtype] = logits[:, mask.shape[1] - 1:]
    assert_fa_close("step logits", step_logits, expected[F64], expected[dtype], OUT_FACTOR)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("how", ["position_ids", "cu_seq_lens"])
def test_packed_sequences(how, device, dtype, counted):
    """Padding-free batches: sequences of 4, 5 and 3 tokens in one row, found from position_ids that
    restart or given as cu_seq_lens_q / _k and max_length_q / _k; each must equal the sdpa model run
    on that sequence alone."""
    model = tiny_model("llama")
    lengths = (4, 5, 3)
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    cu = torch.tensor([0, 4, 9, 12], device=device)
    packing = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5) if how == "cu_seq_lens" else {}
    with torch.no_grad():
        ours = variant(model, OURS, dtype, device)(input_ids=ids, position_ids=positions, **packing).logits[0]
        expected = {}
        for run_dtype in (F64, dtype):
            twin = variant(model, "sdpa", run_dtype, device)
            bounds = ((0, 4), (4, 9), (9, 12))
            expected[run_dtype] = torch.cat([twin(input_ids=ids[:, s:e]).logits[0] for s, e in bounds])
    assert counted["varlen"] == 2 and counted["dense"] == 0
    assert_fa_close("logits", ours, expected[F64], expected[dtype], OUT_FACTOR)


def test_attention_sinks_are_refused_by_name():
    """gpt-oss-style attention sinks (s_aux) have no kernel here: a clear error, before any kernel."""
    q = torch.randn(1, 2, 3, 16)
    with pytest.raises(NotImplementedError, match=r"attention sinks \(s_aux\)"):
        integration.attention_forward(None, q, q, q, None, s_aux=torch.zeros(2))
