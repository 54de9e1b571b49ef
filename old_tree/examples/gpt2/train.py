"""Train a small GPT-2 from scratch on the Python standard library's source files, once with
flash_attn's MHA and once with standard attention in plain PyTorch (dropout 0.1 in both), from the
same seed, weights and batches; write the loss curves, tokens/s, peak memory, and the memory of one
training step at long context (up to 4k tokens), where the plain attention's grows with the square
of the context.

    python examples/gpt2/train.py           # GPU: the full run, sized to fit one 10-minute call
    python examples/gpt2/train.py --quick   # GPU: shorter curves, 4k memory only
    python examples/gpt2/train.py --smoke   # CPU: a few steps of a tiny model, seconds (CI runs it)

Outputs go to --out (default examples/gpt2/results/<device>_<date>/): loss_curves.png, memory.png,
results.md, results.json. Each training run also stops at its preset's time limit, so a slower
device shortens the curves rather than overrunning the call.
"""

import argparse
import dataclasses
import datetime
import math
import pathlib
import re
import sys
import time

import torch
import torch.nn.functional as F

import gpt2_data
import gpt2_model
import gpt2_report


@dataclasses.dataclass(frozen=True)
class Preset:
    model: gpt2_model.GPTConfig
    batch_size: int
    steps: int
    eval_every: int
    eval_batches: int
    max_bytes: int
    minutes_per_run: float
    memory_contexts: tuple
    memory_batch: int
    lr: float = 1e-3


PRESETS = {
    "full": Preset(gpt2_model.GPTConfig(), batch_size=32, steps=600, eval_every=50, eval_batches=8,
                   max_bytes=16 << 20, minutes_per_run=3.0, memory_contexts=(1024, 2048, 4096), memory_batch=8),
    "quick": Preset(gpt2_model.GPTConfig(), batch_size=32, steps=150, eval_every=25, eval_batches=4,
                    max_bytes=4 << 20, minutes_per_run=1.5, memory_contexts=(4096,), memory_batch=8),
    "smoke": Preset(gpt2_model.GPTConfig(n_positions=32, n_layer=2, n_head=2, n_embd=64), batch_size=4, steps=4,
                    eval_every=2, eval_batches=1, max_bytes=256 << 10, minutes_per_run=1.0, memory_contexts=(),
                    memory_batch=1),
}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter GPU run")
    size.add_argument("--smoke", action="store_true", help="tiny CPU run (seconds), for CI")
    parser.add_argument("--out", type=pathlib.Path, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def choose_preset(args):
    """smoke runs on the CPU; the others need a GPU (on the CPU they would take hours)."""
    if args.smoke:
        return "smoke", torch.device("cpu")
    if not torch.cuda.is_available():
        print("no CUDA device: running the CPU smoke preset instead (--smoke)", file=sys.stderr)
        return "smoke", torch.device("cpu")
    return ("quick" if args.quick else "full"), torch.device("cuda")


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def default_out(device):
    slug = re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")
    return pathlib.Path(__file__).parent / "results" / f"{slug}_{datetime.date.today().isoformat()}"


def autocast(device):
    """bf16 autocast on the GPU (the attention kernels' dtype); fp32 on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def learning_rate(step, preset):
    """Linear warm-up over the first 10% of the steps, then cosine down to 10% of the peak."""
    warmup = max(1, preset.steps // 10)
    if step < warmup:
        return preset.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, preset.steps - warmup)
    return preset.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def loss_of(model, inputs, targets, device):
    with autocast(device):
        logits = model(inputs.to(device))
    return F.cross_entropy(logits.float().flatten(0, 1), targets.to(device).flatten())


@torch.no_grad()
def validation_loss(model, batches, device):
    model.eval()
    loss = sum(loss_of(model, x, y, device).item() for x, y in batches) / len(batches)
    model.train()
    return loss


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device):
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def train(kind, initial_state, corpus, preset, device, seed):
    """One training run from initial_state; returns its curves and measurements."""
    reset_memory(device)
    model = gpt2_model.GPT(kind, preset.model).to(device)
    model.load_state_dict(initial_state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.1)
    torch.manual_seed(seed)  # the dropout masks' generator
    batches = torch.Generator().manual_seed(seed)
    val_batches = [corpus.batch("val", preset.batch_size, preset.model.n_positions, torch.Generator().manual_seed(i))
                   for i in range(preset.eval_batches)]
    run = {"eval_steps": [], "train_loss": [], "val_loss": []}
    warmup_steps, losses, start = min(10, preset.steps // 5), [], time.perf_counter()
    timed_from = start
    for step in range(preset.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, preset)
        loss = loss_of(model, *corpus.batch("train", preset.batch_size, preset.model.n_positions, batches), device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step + 1 == warmup_steps:
            synchronize(device)
            timed_from = time.perf_counter()
        out_of_time = time.perf_counter() - start > 60 * preset.minutes_per_run
        if (step + 1) % preset.eval_every == 0 or step + 1 == preset.steps or out_of_time:
            run["eval_steps"].append(step + 1)
            run["train_loss"].append(torch.stack(losses).mean().item())
            run["val_loss"].append(validation_loss(model, val_batches, device))
            losses = []
        if out_of_time:
            break
    synchronize(device)
    timed_steps = step + 1 - warmup_steps
    tokens = timed_steps * preset.batch_size * preset.model.n_positions
    run.update(steps_done=step + 1, tokens_per_s=tokens / max(time.perf_counter() - timed_from, 1e-9),
               peak_mib=peak_mib(device), seconds=time.perf_counter() - start)
    return run


def long_context_step(kind, context, preset, device, seed):
    """Peak memory and time of one forward + backward at `context` tokens (None, None when out of memory)."""
    config = dataclasses.replace(preset.model, n_positions=context)
    reset_memory(device)
    try:
        model = gpt2_model.build(kind, config, seed, device)
        tokens = torch.randint(0, config.vocab_size, (preset.memory_batch, context + 1))
        times = []
        for _ in range(3):  # the first one warms up
            synchronize(device)
            begin = time.perf_counter()
            loss_of(model, tokens[:, :-1], tokens[:, 1:], device).backward()
            synchronize(device)
            times.append(time.perf_counter() - begin)
        return peak_mib(device), 1000 * min(times[1:])
    except torch.OutOfMemoryError:
        return None, None
    finally:
        model = None
        reset_memory(device)


def memory_sweep(preset, device, seed):
    rows = []
    for context in preset.memory_contexts:
        for kind in gpt2_model.ATTENTIONS:
            peak, ms = long_context_step(kind, context, preset, device, seed)
            rows.append(dict(context=context, attention=kind, peak_mib=peak, ms_per_step=ms))
            print(f"context {context} {kind}: peak {peak} MiB, {ms} ms/step", flush=True)
    return rows


def describe(preset_name, preset, corpus, device):
    config = preset.model
    title = (f"GPT-2 from scratch on the Python standard library: {device_name(device)}, torch {torch.__version__}, "
             f"{datetime.date.today().isoformat()}")
    setup = (f"Preset `{preset_name}`: {config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads, "
             f"context {config.n_positions}, byte vocabulary, dropout {config.dropout} (attention probabilities and "
             f"residual branches), batch {preset.batch_size}, AdamW lr {preset.lr}, up to {preset.steps} steps or "
             f"{preset.minutes_per_run} min per run; {corpus.splits['train'].numel():,} training and "
             f"{corpus.splits['val'].numel():,} validation bytes; "
             f"{'bf16 autocast' if device.type == 'cuda' else 'fp32'}.")
    return title, setup


def main(argv=None):
    args = parse_args(argv)
    preset_name, device = choose_preset(args)
    preset = PRESETS[preset_name]
    corpus = gpt2_data.ByteCorpus(preset.max_bytes)
    initial_state = gpt2_model.build("ours", preset.model, args.seed, "cpu").state_dict()
    runs = {}
    for kind in gpt2_model.ATTENTIONS:
        runs[kind] = train(kind, initial_state, corpus, preset, device, args.seed)
        print(f"{kind}: {runs[kind]['steps_done']} steps, val loss {runs[kind]['val_loss'][-1]:.3f}, "
              f"{runs[kind]['tokens_per_s']:,.0f} tokens/s, peak {runs[kind]['peak_mib']} MiB", flush=True)
    title, setup = describe(preset_name, preset, corpus, device)
    results = dict(title=title, setup=setup, preset=preset_name, runs=runs, memory_batch=preset.memory_batch,
                   memory=memory_sweep(preset, device, args.seed) if device.type == "cuda" else [])
    out_dir = args.out or default_out(device)
    gpt2_report.write_all(results, out_dir)
    print(f"wrote {out_dir}")
    return results


if __name__ == "__main__":
    main()
