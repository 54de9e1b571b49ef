"""Training text available offline on any machine: the Python standard library's own source files,
read as bytes (a 256-token vocabulary, so no tokenizer and no download).

Files are taken in sorted path order up to a byte budget, every tenth file is held out for
validation, so both splits mix the same kinds of code. Batches are random windows drawn with a
caller-seeded generator: both attentions see the same batches in the same order.
"""

import pathlib
import sysconfig

import torch

SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_files():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = (p for p in root.rglob("*.py") if not SKIPPED_DIRS & set(p.relative_to(root).parts))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


class ByteCorpus:
    """train / val uint8 token tensors from up to max_bytes of standard-library source."""

    def __init__(self, max_bytes):
        splits = {"train": [], "val": []}
        total = 0
        for index, path in enumerate(stdlib_files()):
            if total >= max_bytes:
                break
            text = path.read_bytes()[: max_bytes - total]
            splits["val" if index % 10 == 9 else "train"].append(text)
            total += len(text)
        self.splits = {name: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
                       for name, parts in splits.items()}

    def batch(self, split, batch_size, seqlen, generator):
        """Inputs and next-byte targets, (batch_size, seqlen) int64 each, on the CPU."""
        data = self.splits[split]
        if data.numel() <= seqlen + 1:
            raise ValueError(f"the {split} split has {data.numel()} bytes, too few for windows of {seqlen + 1}")
        starts = torch.randint(0, data.numel() - seqlen - 1, (batch_size,), generator=generator)
        windows = torch.stack([data[s:s + seqlen + 1] for s in starts.tolist()]).long()
        return windows[:, :-1], windows[:, 1:]
