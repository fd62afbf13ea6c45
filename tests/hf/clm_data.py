"""What the two causal-LM scripts here share: a dataset of token blocks and a report of the
micro-batch the model was fed. Imported from beside them, as an example's own helper module."""

from __future__ import annotations

import torch


class TokenBlocks(torch.utils.data.Dataset):
    """Fixed blocks of tokens, the same for every run of a seed: a stand-in for a tokenized,
    grouped corpus (run_clm's ``group_texts``)."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        # Some structure to learn: each block counts up from a random start.
        starts = torch.randint(0, vocab_size, (num_blocks, 1), generator=generator)
        self.tokens = (starts + torch.arange(block_size)) % vocab_size

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def report_micro_batch(model: torch.nn.Module) -> None:
    """Print the size of the first micro-batch the model is fed."""

    def first(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        tokens = kwargs.get("input_ids", args[0] if args else None)
        print(f"micro-batch used: {tokens.shape[0]}", flush=True)
        handle.remove()

    handle = model.register_forward_pre_hook(first, with_kwargs=True)
