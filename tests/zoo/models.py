"""Zoo models from `transformers`, built from small configs with random weights (no downloads)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

warnings.filterwarnings("ignore", message=".*token_id.*")


class FirstOutput(nn.Module):
    """transformers models return ModelOutput objects; aotc packages return tensors."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, return_dict=False)[0]


class WithMask(nn.Module):
    """Token ids and a padding mask: transformers' attention-mask path (expand, compare, where/masked_fill)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, attention_mask=attention_mask, return_dict=False)[0]


def padded_inputs(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and a right-padded mask: row i keeps its first seq - i tokens (at least one), as a tokenizer pads."""
    ids = torch.randint(0, 128, (batch, seq))
    keep = torch.clamp(seq - torch.arange(batch), min=1)
    mask = (torch.arange(seq)[None, :] < keep[:, None]).long()
    return ids, mask


def padded_dynamic_shapes() -> tuple:
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)
    return ({0: batch, 1: seq}, {0: batch, 1: seq})


def calibrate_batch_norms(model: nn.Module, image_size: int) -> nn.Module:
    """Random init leaves BatchNorm's running stats at (0, 1), so activations shrink layer by layer (MobileNetV2's
    output was ~1e-21) and any comparison passes. Estimate the stats on random images, as training would set
    them, then halve every scale: at unit gain a random deep net is chaotic (eager bf16 drifts 0.1-0.7 from
    fp32 on ResNet-50), at half gain it is as stable as a trained one (< 1e-2) and its outputs stay O(0.01-1).
    Returns the model in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        gen = torch.Generator().manual_seed(1234)
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average over the calibration batches
        model.train()
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(4, 3, image_size, image_size, generator=gen))
        for bn in norms:
            bn.momentum = 0.1
            if bn.weight is not None:
                bn.weight.data *= 0.5
    return model.eval()


@dataclass(frozen=True)
class ZooModel:
    name: str
    factory: Callable[[], nn.Module]
    text: bool  # token ids (batch, seq) vs images (batch, 3, H, W)

    def make(self) -> nn.Module:
        """The model in eval mode, batch norms calibrated."""
        model = self.factory()
        return model.eval() if self.text else calibrate_batch_norms(model, 32)


def _t():  # imported lazily so collection stays fast where transformers is missing
    import transformers

    return transformers


ZOO = [
    ZooModel("bert", lambda: _t().BertModel(_t().BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)), True),  # fmt: skip
    ZooModel("gpt2", lambda: _t().GPT2Model(_t().GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
             n_positions=64, bos_token_id=0, eos_token_id=0)), True),  # fmt: skip
    ZooModel("llama", lambda: _t().LlamaModel(_t().LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)), True),  # fmt: skip
    ZooModel("t5_encoder", lambda: _t().T5EncoderModel(_t().T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128,
             num_layers=2, num_heads=4)), True),  # fmt: skip
    ZooModel("vit", lambda: _t().ViTModel(_t().ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=128)), False),  # fmt: skip
    ZooModel("resnet", lambda: _t().ResNetModel(_t().ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])), False),
    ZooModel("convnext", lambda: _t().ConvNextModel(_t().ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)), False),
    # beyond the list: each brings ops the others lack (alibi repeat, negative index, window attention,
    # GRN norm, upsampling)
    ZooModel("bloom", lambda: _t().BloomModel(_t().BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4)), True),
    ZooModel("falcon", lambda: _t().FalconModel(_t().FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4)), True),  # multi-query attention: x[..., [-2], :]  # fmt: skip
    ZooModel("swin", lambda: _t().SwinModel(_t().SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
             num_heads=[2, 2], window_size=4)), False),  # fmt: skip
    ZooModel("convnextv2", lambda: _t().ConvNextV2Model(_t().ConvNextV2Config(hidden_sizes=[16, 32], depths=[1, 1],
             num_stages=2)), False),  # fmt: skip
    ZooModel("mobilevit", lambda: _t().MobileViTModel(_t().MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32],
             neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])), False),  # fmt: skip
    ZooModel("mobilenet_v2", lambda: _t().MobileNetV2Model(_t().MobileNetV2Config(image_size=32, depth_multiplier=0.35)), False),
]


def inputs(z: ZooModel, batch: int, seq: int = 16) -> tuple[torch.Tensor, ...]:
    if z.text:
        return (torch.randint(0, 128, (batch, seq)),)
    return (torch.randn(batch, 3, 32, 32),)


def dynamic_shapes(z: ZooModel) -> tuple:
    dims = {0: torch.export.Dim("batch", min=1, max=8)}
    if z.text:
        dims[1] = torch.export.Dim("seq", min=2, max=64)
    return (dims,)


# ---- real sizes, for the GPU run (benchmarks/gpu_zoo.py) ---------------------------------------------


def _tv(name: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)()

    return make


class Plain(nn.Module):
    """torchvision models return tensors already; same wrapper shape as FirstOutput."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


@dataclass(frozen=True)
class RealModel:
    name: str
    make: Callable[[], nn.Module]
    text: bool
    shapes: tuple[tuple[int, int], ...]  # (batch, seq) for text; (batch, image size) for images
    torchvision: bool = False


REAL = [  # transformers' default configs are the real sizes (ViT-B/16, ResNet-50, ConvNeXt-T, MobileNetV2 1.0)
    RealModel("hf_vit_base", lambda: _t().ViTModel(_t().ViTConfig()), False, ((8, 224), (2, 224))),
    RealModel("hf_resnet50", lambda: _t().ResNetModel(_t().ResNetConfig()), False, ((8, 224), (2, 224))),
    RealModel("hf_convnext_tiny", lambda: _t().ConvNextModel(_t().ConvNextConfig()), False, ((8, 224), (2, 224))),
    RealModel("hf_mobilenet_v2", lambda: _t().MobileNetV2Model(_t().MobileNetV2Config()), False, ((8, 224), (2, 224))),
    RealModel("resnet50", _tv("resnet50"), False, ((8, 224), (2, 224)), torchvision=True),
    RealModel("vit_b_16", _tv("vit_b_16"), False, ((8, 224), (2, 224)), torchvision=True),
    RealModel("mobilenet_v3_large", _tv("mobilenet_v3_large"), False, ((8, 224), (2, 224)), torchvision=True),
    RealModel("convnext_tiny", _tv("convnext_tiny"), False, ((8, 224), (2, 224)), torchvision=True),
    RealModel("bert_base", lambda: _t().BertModel(_t().BertConfig()), True, ((8, 128), (2, 64))),
    RealModel("gpt2_small", lambda: _t().GPT2Model(_t().GPT2Config()), True, ((2, 256), (1, 128))),
    RealModel("t5_small_encoder", lambda: _t().T5EncoderModel(_t().T5Config()), True, ((8, 128), (2, 64))),
    RealModel("llama_4l_1024", lambda: _t().LlamaModel(_t().LlamaConfig(hidden_size=1024, num_hidden_layers=4,
              num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816)), True, ((4, 128), (1, 64))),  # fmt: skip
]


def real_module(m: RealModel) -> nn.Module:
    model = m.make().eval()
    for name, mod in model.named_modules():
        # torchvision zero-initialises some classifier heads (vit_b_16): a zero output proves nothing
        if isinstance(mod, nn.Linear) and name.endswith("head") and not mod.weight.any():
            nn.init.normal_(mod.weight, std=0.02)
    if not m.text:
        calibrate_batch_norms(model, m.shapes[0][1])
    return (Plain if m.torchvision else FirstOutput)(model)


def real_inputs(m: RealModel, batch: int, size: int) -> tuple[torch.Tensor, ...]:
    if m.text:
        return (torch.randint(0, 1000, (batch, size)),)
    return (torch.randn(batch, 3, size, size),)


def real_dynamic(m: RealModel) -> tuple:
    dims = {0: torch.export.Dim("batch", min=1, max=32)}
    if m.text:
        dims[1] = torch.export.Dim("seq", min=2, max=512)
    return (dims,)
