"""Training throughput and peak memory of a stack of LLaMA-style decoder blocks (RMSNorm, rotary, GQA,
SwiGLU) at long context, with three attentions on the same weights and inputs: flash_attn's MHA,
plain PyTorch attention and torch's scaled_dot_product_attention; to set beside the FlashAttention
articles' LLaMA claim (2.9x throughput, -52.8% memory at 4k on an A100; issue #10).

    python examples/llama_block/bench.py                  # GPU: contexts 2k, 4k, 8k (estimated 1-2 min on an H100)
    python examples/llama_block/bench.py --contexts 4096  # GPU: 4k only
    python examples/llama_block/bench.py --smoke          # CPU: a tiny model, a few steps (seconds; CI runs it)

Outputs go to --out (default examples/llama_block/results/<device>_<date>/): results.md,
results.json, throughput_memory.png. Each run stops its timed steps at the preset's time limit, so a
slower device measures fewer steps rather than overrunning.
"""

import argparse
import dataclasses
import datetime
import gc
import pathlib
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flash_attn
import llama_model
import llama_report


@dataclasses.dataclass(frozen=True)
class Preset:
    model: llama_model.LlamaConfig
    contexts: tuple
    tokens_per_step: int  # batch = tokens_per_step // context, so every context trains on as many tokens
    warmup_steps: int
    timed_steps: int
    seconds_per_run: float  # timed steps stop after this, at least two of them kept
    lr: float = 3e-4


PRESETS = {
    "full": Preset(llama_model.LlamaConfig(), contexts=(2048, 4096, 8192), tokens_per_step=8192, warmup_steps=3,
                   timed_steps=10, seconds_per_run=20.0),
    "smoke": Preset(llama_model.LlamaConfig(vocab_size=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                                            intermediate_size=128),
                    contexts=(32, 64), tokens_per_step=128, warmup_steps=1, timed_steps=2, seconds_per_run=10.0),
}

# First-step agreement, as the relative spread (max - min) / |mean| over the implementations: bf16
# autocast rounds each implementation's intermediate results differently (8-bit mantissa, 0.4%),
# fp32 on the CPU only by fp32 roundings.
TOLERANCES = {"bf16": {"loss": 5e-3, "grad_norm": 5e-2}, "fp32": {"loss": 1e-4, "grad_norm": 1e-3}}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run (seconds), for CI")
    parser.add_argument("--contexts", type=int, nargs="+", help="contexts to measure (default: the preset's)")
    parser.add_argument("--out", type=pathlib.Path, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def choose_preset(args):
    """smoke runs on the CPU; the full preset needs a GPU (on the CPU it would take hours)."""
    if args.smoke:
        return "smoke", torch.device("cpu")
    if not torch.cuda.is_available():
        print("no CUDA device: running the CPU smoke preset instead (--smoke)", file=sys.stderr)
        return "smoke", torch.device("cpu")
    return "full", torch.device("cuda")


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def default_out(device):
    slug = re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")
    return pathlib.Path(__file__).parent / "results" / f"{slug}_{datetime.date.today().isoformat()}"


def precision(device):
    """bf16 autocast on the GPU (the attention kernels' dtype, fp32 weights and AdamW state); fp32 on the CPU."""
    return "bf16" if device.type == "cuda" else "fp32"


def autocast(device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device):
    """Frees what a finished (or out-of-memory) run left, and restarts the peak counter."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def mib(amount):
    return amount / 2**20


def token_batches(count, batch, context, vocab_size, seed, device):
    """Random tokens (batch, context + 1) for each step, the same for every implementation; made before
    the timed steps, so no step waits for a host-to-device copy."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (batch, context + 1), generator=generator).to(device) for _ in range(count)]


def train_step(model, optimizer, tokens, device):
    """Forward, backward, gradient clipping at 1.0 and an AdamW step; the loss and the gradient norm."""
    with autocast(device):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm


def run_steps(kind, context, batch, preset, state, device, seed):
    """Warm-up then timed training steps of one implementation from `state`; its measurements."""
    model = llama_model.build(kind, preset.model, device, state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=device.type == "cuda")
    batches = token_batches(preset.warmup_steps + preset.timed_steps, batch, context, preset.model.vocab_size, seed,
                            device)
    losses, grad_norms, times, start = [], [], [], time.perf_counter()
    for step, tokens in enumerate(batches):
        synchronize(device)
        begin = time.perf_counter()
        loss, grad_norm = train_step(model, optimizer, tokens, device)
        synchronize(device)
        if step >= preset.warmup_steps:
            times.append(time.perf_counter() - begin)
        losses.append(loss.item())
        grad_norms.append(grad_norm.item())
        if len(times) >= 2 and time.perf_counter() - start > preset.seconds_per_run:
            break
    seconds = statistics.median(times)
    peak = mib(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    resident = mib(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None
    return dict(oom=False, timed_steps=len(times), ms_per_step=1000 * seconds, tokens_per_s=batch * context / seconds,
                peak_mib=peak, above_resident_mib=None if peak is None else peak - resident,
                first_loss=losses[0], first_grad_norm=grad_norms[0], last_loss=losses[-1])


def batch_size(context, preset):
    return max(1, preset.tokens_per_step // context)


def measure(kind, context, preset, state, device, seed):
    """One implementation at one context, or an OOM row where it ran out of GPU memory."""
    batch = batch_size(context, preset)
    row = dict(context=context, batch=batch, attention=kind)
    try:
        row.update(run_steps(kind, context, batch, preset, state, device, seed))
    except torch.OutOfMemoryError:
        row.update(oom=True, timed_steps=0, ms_per_step=None, tokens_per_s=None, peak_mib=None,
                   above_resident_mib=None, first_loss=None, first_grad_norm=None, last_loss=None)
    return row


def spread(values):
    return (max(values) - min(values)) / abs(statistics.fmean(values))


def check_agreement(rows, tolerance):
    """Whether the first step's loss and gradient norm of the implementations that ran agree (agree is
    None where fewer than two ran: nothing to compare)."""
    ran = [row for row in rows if not row["oom"]]
    loss_spread = spread([row["first_loss"] for row in ran]) if ran else 0.0
    grad_norm_spread = spread([row["first_grad_norm"] for row in ran]) if ran else 0.0
    agree = loss_spread <= tolerance["loss"] and grad_norm_spread <= tolerance["grad_norm"]
    return dict(context=rows[0]["context"], first_loss={row["attention"]: row["first_loss"] for row in ran},
                loss_spread=loss_spread, grad_norm_spread=grad_norm_spread, agree=agree if len(ran) >= 2 else None)


def measure_context(context, preset, state, device, seed, tolerance):
    """The three implementations at one context, PyTorch's SDPA backend there, and their agreement."""
    dtype = torch.bfloat16 if precision(device) == "bf16" else torch.float32
    backend = llama_model.sdpa_backend(preset.model, batch_size(context, preset), context, device, dtype)
    rows = []
    for kind in llama_model.ATTENTIONS:
        release_memory(device)
        rows.append(measure(kind, context, preset, state, device, seed))
        release_memory(device)
        print(_progress(rows[-1]), flush=True)
    check = dict(check_agreement(rows, tolerance), sdpa_backend=backend)
    print(f"context {context}: SDPA backend {backend}; first-step loss "
          + ", ".join(f"{kind} {loss:.5f}" for kind, loss in check["first_loss"].items())
          + f"; spread {check['loss_spread']:.1e} (loss), {check['grad_norm_spread']:.1e} (grad norm): "
          + llama_report.verdict(check), flush=True)
    return rows, check


def _progress(row):
    if row["oom"]:
        return f"context {row['context']} {row['attention']}: OOM"
    peak = "" if row["peak_mib"] is None else f", peak {row['peak_mib']:,.0f} MiB"
    return (f"context {row['context']} {row['attention']}: {row['tokens_per_s']:,.0f} tokens/s, "
            f"{row['ms_per_step']:.1f} ms/step over {row['timed_steps']} steps{peak}")


def describe(preset_name, preset, contexts, parameters, device):
    config = preset.model
    title = (f"LLaMA-style blocks, training throughput and memory: {device_name(device)}, torch {torch.__version__}, "
             f"{datetime.date.today().isoformat()}")
    setup = (f"Preset `{preset_name}`: {config.n_layer} decoder blocks (RMSNorm, rotary base {config.rope_base:g}, "
             f"{config.n_head} query / {config.n_kv_head} KV heads of {config.head_dim}, SwiGLU "
             f"{config.intermediate_size}), {config.n_embd} wide, vocabulary {config.vocab_size}, {parameters:,} "
             f"parameters; contexts {', '.join(map(str, contexts))} with {preset.tokens_per_step} tokens per step "
             f"(batch = tokens / context), random tokens; AdamW lr {preset.lr}"
             f"{' (fused)' if device.type == 'cuda' else ''}, gradient clipping 1.0; "
             f"{'bf16 autocast, fp32 weights' if precision(device) == 'bf16' else 'fp32'}; flash_attn "
             f"{flash_attn.__version__}. Each implementation starts from the same weights; tokens/s is batch x "
             f"context over the median step time (forward + backward + AdamW, synchronized) of up to "
             f"{preset.timed_steps} steps (or {preset.seconds_per_run:g} s) after {preset.warmup_steps} warm-up "
             f"step(s); peak memory is torch.cuda.max_memory_allocated over the implementation's whole run, reset "
             f"before it; "
             f"'above weights + AdamW' subtracts what stays allocated after the last step.")
    return title, setup


def main(argv=None):
    args = parse_args(argv)
    preset_name, device = choose_preset(args)
    preset = PRESETS[preset_name]
    contexts = tuple(args.contexts or preset.contexts)
    tolerance = TOLERANCES[precision(device)]
    state = llama_model.initial_state(preset.model, args.seed, device)
    runs, checks = [], []
    for context in contexts:
        rows, check = measure_context(context, preset, state, device, args.seed, tolerance)
        runs += rows
        checks.append(check)
    title, setup = describe(preset_name, preset, contexts, llama_model.parameter_count(state), device)
    results = dict(title=title, setup=setup, preset=preset_name, device=device_name(device),
                   torch=torch.__version__, date=datetime.date.today().isoformat(), precision=precision(device),
                   tolerance=tolerance, articles=llama_report.ARTICLES, runs=runs, checks=checks)
    out_dir = args.out or default_out(device)
    llama_report.write_all(results, out_dir)
    print(f"wrote {out_dir}")
    return results


if __name__ == "__main__":
    main()
