"""A PyTorch Lightning training script with Lightning's ``DeepSpeedStrategy``, offline.

As Lightning's DeepSpeed guide has it: a ``LightningModule`` (a small next-token model over
synthetic token blocks) whose ``configure_optimizers`` returns a torch AdamW, a ``Trainer`` with
``strategy=DeepSpeedStrategy(config="ds_config.json")``, ``trainer.fit()`` and
``trainer.save_checkpoint()``. Nothing in it knows autotune: under ``autotune run -- ...`` or
``python -m autotune.deepspeed`` the strategy's DeepSpeed is autotune's built-in engine, and
under plain ``torchrun`` with ``DS_ACCELERATOR=cpu`` it is the installed DeepSpeed.

Lightning refuses DeepSpeed on a machine without CUDA on its own; ``CPUDeepSpeedStrategy``
skips that check and numbers the ranks' CPU devices, which is all it changes.

It prints the micro-batch the model was fed (``micro-batch used: N``) and, on rank 0, each
step's loss (``loss at step N: X``).
"""

from __future__ import annotations

import argparse
import os

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy
from torch import nn


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """``DeepSpeedStrategy`` on a machine without CUDA, where Lightning refuses it on its own.

    DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) trains there, given each rank's device
    index, which Lightning takes from the rank's device (a CPU device has none): the ranks' CPU
    devices are numbered, and Lightning's CUDA-only check is skipped.
    """

    def setup_environment(self) -> None:
        self.parallel_devices = [torch.device("cpu", i) for i in range(len(self.parallel_devices))]
        DDPStrategy.setup_environment(self)


class TokenBlocks(torch.utils.data.Dataset):
    """Blocks of tokens that count up from a random start: something to learn."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        starts = torch.randint(0, vocab_size, (num_blocks, 1), generator=generator)
        self.tokens = (starts + torch.arange(block_size)) % vocab_size

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]


class NextToken(pl.LightningModule):
    def __init__(self, vocab_size: int, width: int, learning_rate: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, width)
        self.body = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.LayerNorm(width)
        )
        self.head = nn.Linear(width, vocab_size)
        self.reported = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))

    def training_step(self, tokens: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if not self.reported:
            print(f"micro-batch used: {tokens.shape[0]}", flush=True)
            self.reported = True
        logits = self(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        if self.global_rank == 0:
            print(f"loss at step {self.global_step + 1}: {loss.item()!r}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a next-token model with Lightning")
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--vocab_size", type=int, default=128)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--num_blocks", type=int, default=512)
    parser.add_argument("--output_dir", default=None)
    args = parser.parse_args()

    pl.seed_everything(42)
    model = NextToken(args.vocab_size, args.width, args.learning_rate)
    data = TokenBlocks(args.num_blocks, 33, args.vocab_size)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
    strategy_class = DeepSpeedStrategy if torch.cuda.is_available() else CPUDeepSpeedStrategy
    trainer = pl.Trainer(
        accelerator="auto",
        devices=args.devices,
        strategy=strategy_class(config=args.deepspeed_config),
        precision=args.precision,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, loader)
    if args.output_dir:
        trainer.save_checkpoint(os.path.join(args.output_dir, "last.ckpt"))
        if trainer.is_global_zero:
            print(f"saved to {os.path.abspath(args.output_dir)}", flush=True)


if __name__ == "__main__":
    main()
