"""What the zoo trains on: random samples of each shape its models take, batched as users batch them (sequences of
different lengths padded per batch in a ``collate_fn``), sized so that every loop ends with a smaller batch."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset

Sample = dict[str, torch.Tensor]
Batch = dict[str, torch.Tensor]

VOCAB = 96
CLASSES = 4
IMAGE = 32

# samples and batch size of each loop: 22 / 4 trains six batches a epoch, the last of 2; validation 4, 4, 2;
# test 4, 2; predict 4, 1 (a batch of one: torch treats a size of 1 apart)
SIZES = {"train": (22, 4), "val": (10, 4), "test": (6, 4), "predict": (5, 4)}


def _lengths(count: int, generator: torch.Generator, low: int = 5, high: int = 17) -> list[int]:
    return torch.randint(low, high, (count,), generator=generator).tolist()


def tokens(count: int, generator: torch.Generator) -> list[Sample]:
    """Token sequences of 5-16 tokens, a class label each (a causal LM ignores it)."""
    return [
        {
            "input_ids": torch.randint(3, VOCAB, (length,), generator=generator),
            "label": torch.randint(0, 2, (), generator=generator),
        }
        for length in _lengths(count, generator)
    ]


def pairs(count: int, generator: torch.Generator) -> list[Sample]:
    """Source and target token sequences of their own lengths (translation, summarization)."""
    return [
        {
            "input_ids": torch.randint(3, VOCAB, (source,), generator=generator),
            "target": torch.randint(3, VOCAB, (target,), generator=generator),
        }
        for source, target in zip(_lengths(count, generator), _lengths(count, generator, 3, 9), strict=True)
    ]


def images(count: int, generator: torch.Generator) -> list[Sample]:
    return [
        {
            "pixel_values": torch.randn(3, IMAGE, IMAGE, generator=generator),
            "label": torch.randint(0, CLASSES, (), generator=generator),
        }
        for _ in range(count)
    ]


def masks(count: int, generator: torch.Generator) -> list[Sample]:
    """Images with a class per pixel (semantic segmentation)."""
    return [
        {
            "pixel_values": torch.randn(3, IMAGE, IMAGE, generator=generator),
            "mask": torch.randint(0, 3, (IMAGE, IMAGE), generator=generator),
        }
        for _ in range(count)
    ]


def signals(count: int, generator: torch.Generator) -> list[Sample]:
    """Multichannel signals of 12-40 steps (8 features a step), a class each: the issue's sequence classifier."""
    return [
        {
            "features": torch.randn(length, 8, generator=generator),
            "label": torch.randint(0, CLASSES, (), generator=generator),
        }
        for length in _lengths(count, generator, 12, 41)
    ]


def _pad(sequences: list[torch.Tensor], value: float | int = 0) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=value)


def collate_lm(samples: list[Sample]) -> Batch:
    ids = _pad([s["input_ids"] for s in samples])
    mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def collate_classes(samples: list[Sample]) -> Batch:
    ids = _pad([s["input_ids"] for s in samples])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": torch.stack([s["label"] for s in samples])}


def collate_pairs(samples: list[Sample]) -> Batch:
    ids = _pad([s["input_ids"] for s in samples])
    return {
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
        "labels": _pad([s["target"] for s in samples], -100),
    }


def collate_images(samples: list[Sample]) -> Batch:
    return {
        "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
        "labels": torch.stack([s["label"] for s in samples]),
    }


def collate_masks(samples: list[Sample]) -> Batch:
    return {
        "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
        "labels": torch.stack([s["mask"] for s in samples]),
    }


def collate_signals(samples: list[Sample]) -> Batch:
    """Padded per batch, channels first for Conv1d, with each sequence's length (the model masks the padding)."""
    return {
        "features": _pad([s["features"] for s in samples]),
        "lengths": torch.tensor([len(s["features"]) for s in samples]),
        "labels": torch.stack([s["label"] for s in samples]),
    }


KINDS: dict[str, tuple[Callable[[int, torch.Generator], list[Sample]], Callable[[list[Sample]], Batch]]] = {
    "lm": (tokens, collate_lm),
    "classes": (tokens, collate_classes),
    "pairs": (pairs, collate_pairs),
    "images": (images, collate_images),
    "masks": (masks, collate_masks),
    "signals": (signals, collate_signals),
}


def loaders(kind: str, seed: int = 0, drop_last: Collection[str] = (), **loader: Any) -> dict[str, DataLoader]:
    """One loader per loop; only training shuffles; the loops in ``drop_last`` drop their smaller last batch."""
    make, collate = KINDS[kind]
    found: dict[str, DataLoader] = {}
    for offset, (loop, (count, batch)) in enumerate(SIZES.items()):
        samples = make(count, torch.Generator().manual_seed(seed + offset))
        found[loop] = DataLoader(
            cast(Dataset[Sample], samples),
            batch_size=batch,
            shuffle=loop == "train",
            collate_fn=collate,
            drop_last=loop in drop_last,
            **loader,
        )
    return found
