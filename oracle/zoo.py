"""The models: built from their libraries' own code and configs with random weights and tiny sizes (transformers'
text and vision models, torch's recurrent and transformer layers), and user-style models as a new user writes them.
Nothing is downloaded.

timm is not in the zoo: ``import timm`` itself imports torchvision (``timm/layers/create_norm.py`` imports
``torchvision.ops.misc.FrozenBatchNorm2d``), and torchvision's wheels do not load against the CPU torch this
machine has (docs/oracle.md). transformers' own vision models (ViT, ConvNeXt, ResNet, Swin, SegFormer, ...) stand
in for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from oracle.data import CLASSES, VOCAB
from oracle.userlib.backends.torch.nn import PrintingClassifier


@dataclass(frozen=True)
class Case:
    """One model of the zoo: how to build it, what it trains on, and whose code it is."""

    name: str
    family: str  # "transformers", "torch" (torch's own layers in a user's module) or "user"
    data: str  # a kind of oracle.data
    build: Callable[[], nn.Module]
    hf: bool = False  # forward(**batch) returns an output with .loss and .logits
    resume: bool = False  # fit again from the last checkpoint, one epoch more
    predict_bug: bool = False  # predict_step raises, after a fit that went well: the run fails in predict()
    torch_kwargs: dict[str, Any] = field(default_factory=dict)
    dynamo_config: dict[str, Any] = field(default_factory=dict)  # torch._dynamo.config the user set for the run
    trainer_flags: dict[str, Any] = field(default_factory=dict)  # over oracle.run.FLAGS, where a model needs it


def _text(**config: Any) -> dict[str, Any]:
    """A tiny text config: 2 layers, width 32, 2 heads, the zoo's vocabulary."""
    return {"vocab_size": VOCAB, "pad_token_id": 0, **config}


# each loader kind's head: transformers' Auto class that builds the model the task wants from a config
HEADS = {
    "lm": "AutoModelForCausalLM",
    "classes": "AutoModelForSequenceClassification",
    "pairs": "AutoModelForSeq2SeqLM",
    "images": "AutoModelForImageClassification",
    "masks": "AutoModelForSemanticSegmentation",
}


def _transformers(name: str, data: str, settings: dict[str, Any]) -> Case:
    """The library's own model for ``name`` (its ``model_type``) with the head ``data`` asks for."""

    def build() -> nn.Module:
        import transformers

        config = transformers.AutoConfig.for_model(name, **settings)
        return getattr(transformers, HEADS[data]).from_config(config)

    return Case(name, "transformers", data, build, hf=True)


BERT_LIKE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "num_labels": 2,
}
LLAMA_LIKE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
VIT_LIKE = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "num_labels": CLASSES,
}
TWO_STAGES = {"hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": CLASSES}

# model_type: (the kind of data, the config's settings)
TRANSFORMERS_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("lm", _text(n_layer=2, n_embd=32, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=2)),
    "llama": ("lm", _text(**LLAMA_LIKE)),
    "mistral": ("lm", _text(**LLAMA_LIKE)),
    "qwen2": ("lm", _text(**LLAMA_LIKE)),
    "gpt_neox": (
        "lm",
        _text(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64
        ),
    ),
    "opt": (
        "lm",
        _text(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            ffn_dim=64,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
        ),
    ),
    "bert": ("classes", _text(**BERT_LIKE)),
    "roberta": ("classes", _text(**BERT_LIKE, pad_token_id=1)),
    "distilbert": ("classes", _text(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)),
    "electra": ("classes", _text(**BERT_LIKE, embedding_size=32)),
    "t5": ("pairs", _text(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=0)),
    "bart": (
        "pairs",
        _text(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            decoder_start_token_id=2,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
    ),
    "vit": ("images", VIT_LIKE),
    "dinov2": ("images", VIT_LIKE),
    "convnext": ("images", {**TWO_STAGES, "num_stages": 2}),
    "resnet": ("images", {**TWO_STAGES, "embedding_size": 8, "layer_type": "basic"}),
    "swin": (
        "images",
        {
            "image_size": 32,
            "patch_size": 4,
            "embed_dim": 8,
            "depths": [1, 1],
            "num_heads": [1, 2],
            "window_size": 4,
            "num_labels": CLASSES,
        },
    ),
    "segformer": (
        "masks",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [8, 16],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "num_attention_heads": [1, 1],
            "mlp_ratios": [2, 2],
            "decoder_hidden_size": 16,
            "num_labels": 3,
        },
    ),
}
TRANSFORMERS = [_transformers(name, data, settings) for name, (data, settings) in TRANSFORMERS_CONFIGS.items()]


class Conv1dClassifier(nn.Module):
    """The issue's user model: Conv1d + BatchNorm over a padded batch of signals, padding masked out of the mean."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(8, 16, 3, padding=1), nn.BatchNorm1d(16), nn.ReLU(), nn.Conv1d(16, 16, 3, padding=1)
        )
        self.head = nn.Linear(16, CLASSES)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        hidden = self.conv(features.transpose(1, 2))  # (batch, channels, steps)
        steps = torch.arange(hidden.shape[-1], device=hidden.device)
        mask = (steps[None, :] < lengths[:, None]).unsqueeze(1)
        pooled = (hidden * mask).sum(-1) / lengths[:, None]
        return self.head(pooled)


class RecurrentClassifier(nn.Module):
    """torch's LSTM or GRU over the padded signals, the state at each sequence's own last step classified."""

    def __init__(self, cell: type[nn.LSTM] | type[nn.GRU], bidirectional: bool = False) -> None:
        super().__init__()
        self.rnn = cell(8, 16, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(32 if bidirectional else 16, CLASSES)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(features)
        last = output[torch.arange(len(lengths), device=features.device), lengths - 1]
        return self.head(last)


class PackedLSTM(nn.Module):
    """An LSTM over a packed sequence, as most tutorials write it (``pack_padded_sequence`` wants lengths on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(features, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.rnn(packed)
        return self.head(hidden[-1])


class EncoderClassifier(nn.Module):
    """torch's own TransformerEncoder with a key padding mask, mean-pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(features.shape[1], device=features.device)
        padding = steps[None, :] >= lengths[:, None]
        hidden = self.encoder(self.embed(features), src_key_padding_mask=padding)
        return self.head(hidden.masked_fill(padding[..., None], 0).sum(1) / lengths[:, None])


class ThresholdClassifier(nn.Module):
    """A user's data-dependent branch: ``.item()`` in forward (a graph break in the user's own code)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.proj(features)).mean(1)
        if hidden.abs().max().item() > 10.0:  # a user's guard against blow-ups
            hidden = hidden / 10.0
        return self.head(hidden)


TORCH_LAYERS = [
    Case("lstm", "torch", "signals", lambda: RecurrentClassifier(nn.LSTM)),
    Case("gru_bidirectional", "torch", "signals", lambda: RecurrentClassifier(nn.GRU, bidirectional=True)),
    Case("lstm_packed", "torch", "signals", PackedLSTM),
    # the same with the recompile limit a user lowered: a frame falls back to eager in training on every torch
    # in full precision: under bf16 autocast, with torch 2.13 and 2.15, oneDNN's LSTM raised "could not create a
    # primitive descriptor" in this run's validation (the frame had fallen back to eager): the run failed
    Case(
        "lstm_packed_limit",
        "torch",
        "signals",
        PackedLSTM,
        dynamo_config={"recompile_limit": 2},
        trainer_flags={"precision": "32-true"},
    ),
    Case("transformer_encoder", "torch", "signals", EncoderClassifier),
]

USER = [
    Case("conv1d_bn", "user", "signals", Conv1dClassifier, resume=True),
    Case("conv1d_bn_dynamic", "user", "signals", Conv1dClassifier, torch_kwargs={"dynamic": True}),
    Case("threshold_item", "user", "signals", ThresholdClassifier, resume=True),
    Case("conv1d_bn_predict_bug", "user", "signals", Conv1dClassifier, predict_bug=True),
    Case("userlib_print", "user", "signals", lambda: PrintingClassifier(CLASSES)),
]

ZOO: dict[str, Case] = {case.name: case for case in [*TRANSFORMERS, *TORCH_LAYERS, *USER]}
