"""Coverage survey: many more `transformers` architectures than the zoo tests, each captured, built for the CPU,
run through the runtime and compared with eager torch. It finds the gaps (unsupported ops, capture limits);
the zoo tests (test_zoo_cpu.py) keep the models that brought something new.

    python tests/zoo/survey.py [OUT.json] [NAME ...]

Small random-weight configs, dynamic batch (and sequence for text). Prints one line a model: ok and the
error against eager, or the first line of the error aotc gave. Not run in CI (several minutes).
"""

from __future__ import annotations

import datetime
import json
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from zoo.models import calibrate_batch_norms  # noqa: E402

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
Inputs = Callable[[int], tuple[torch.Tensor, ...]]


def _t():  # type: ignore[no-untyped-def]
    import transformers

    return transformers


def _ids(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 128, (b, 11)),)


def _image(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, 3, 32, 32),)


def _models() -> dict[str, tuple[Callable[[], torch.nn.Module], Inputs]]:
    T = _t()
    lm = {"vocab_size": 128, "max_position_embeddings": 64}
    return {
        "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, hidden_dim=128)), _ids),
        "roberta": (lambda: T.RobertaModel(T.RobertaConfig(vocab_size=128, max_position_embeddings=80, **SMALL)), _ids),
        "albert": (lambda: T.AlbertModel(T.AlbertConfig(embedding_size=32, **lm, **SMALL)), _ids),
        "electra": (lambda: T.ElectraModel(T.ElectraConfig(embedding_size=32, **lm, **SMALL)), _ids),
        "mpnet": (lambda: T.MPNetModel(T.MPNetConfig(vocab_size=128, max_position_embeddings=80, **SMALL)), _ids),
        "deberta_v2": (lambda: T.DebertaV2Model(T.DebertaV2Config(**lm, **SMALL)), _ids),
        "clip_text": (lambda: T.CLIPTextModel(T.CLIPTextConfig(**lm, **SMALL)), _ids),
        "qwen2": (lambda: T.Qwen2Model(T.Qwen2Config(num_key_value_heads=2, **lm, **SMALL)), _ids),
        "mistral": (lambda: T.MistralModel(T.MistralConfig(num_key_value_heads=2, **lm, **SMALL)), _ids),
        "phi3": (lambda: T.Phi3Model(T.Phi3Config(num_key_value_heads=2, pad_token_id=0, **lm, **SMALL)), _ids),
        "gemma": (lambda: T.GemmaModel(T.GemmaConfig(num_key_value_heads=2, head_dim=16, **lm, **SMALL)), _ids),
        "stablelm": (lambda: T.StableLmModel(T.StableLmConfig(num_key_value_heads=2, **lm, **SMALL)), _ids),
        "gpt_neox": (lambda: T.GPTNeoXModel(T.GPTNeoXConfig(**lm, **SMALL)), _ids),
        "gptj": (lambda: T.GPTJModel(T.GPTJConfig(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64)), _ids),
        "opt": (lambda: T.OPTModel(T.OPTConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               ffn_dim=128, max_position_embeddings=64, word_embed_proj_dim=64)), _ids),  # fmt: skip
        "bloom": (lambda: T.BloomModel(T.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4)), _ids),
        "falcon": (lambda: T.FalconModel(T.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)), _ids),
        "bart_encoder": (lambda: T.BartModel(T.BartConfig(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                         max_position_embeddings=64)).get_encoder(), _ids),  # fmt: skip
        "mamba": (lambda: T.MambaModel(T.MambaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, state_size=8)), _ids),
        "whisper_encoder": (lambda: T.WhisperModel(T.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                            num_mel_bins=16, max_source_positions=32)).get_encoder(), lambda b: (torch.randn(b, 16, 64),)),  # fmt: skip
        "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **SMALL)), lambda b: (torch.randn(b, 800),)),  # fmt: skip
        "deit": (lambda: T.DeiTModel(T.DeiTConfig(image_size=32, patch_size=8, **SMALL)), _image),
        "dinov2": (lambda: T.Dinov2Model(T.Dinov2Config(image_size=32, patch_size=8, **SMALL)), _image),
        "beit": (lambda: T.BeitModel(T.BeitConfig(image_size=32, patch_size=8, **SMALL)), _image),
        "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, patch_size=8, **SMALL)), _image),
        "yolos": (lambda: T.YolosModel(T.YolosConfig(image_size=[32, 32], patch_size=8, num_detection_tokens=4, **SMALL)), _image),
        "vit_mae": (lambda: T.ViTMAEModel(T.ViTMAEConfig(image_size=32, patch_size=8, mask_ratio=0.0, **SMALL)), _image),
        "swin": (lambda: T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                                 window_size=4)), _image),  # fmt: skip
        "levit": (lambda: T.LevitModel(T.LevitConfig(image_size=32)), _image),
        "segformer": (lambda: T.SegformerModel(T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                      hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                      mlp_ratios=[2, 2])), _image),  # fmt: skip
        "dpt": (lambda: T.DPTModel(T.DPTConfig(image_size=32, patch_size=8, **{**SMALL, "num_hidden_layers": 4},
                backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 16, 32, 32], fusion_hidden_size=32)), _image),  # fmt: skip
        "regnet": (lambda: T.RegNetModel(T.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8)), _image),
        "efficientnet": (lambda: T.EfficientNetModel(T.EfficientNetConfig(image_size=32, depth_coefficient=0.25)), _image),
        "mobilevit": (lambda: T.MobileViTModel(T.MobileViTConfig(image_size=32, hidden_sizes=[16, 24, 32],
                      neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])), _image),  # fmt: skip
        "convnextv2": (lambda: T.ConvNextV2Model(T.ConvNextV2Config(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)), _image),
    }


class FirstTensor(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, return_dict=False)[0]


def survey(name: str, make: Callable[[], torch.nn.Module], inputs: Inputs, cache: Path, tmp: Path) -> dict:
    import aotc
    from aotc_build.build import build_captured
    from aotc_build.capture import capture_module
    from aotc_build.options import BuildOptions, Target

    torch.manual_seed(0)
    model = FirstTensor(calibrate_batch_norms(make(), 32))
    example = inputs(2)
    dims = {0: torch.export.Dim("batch", min=1, max=8)}
    if example[0].dtype == torch.int64:
        dims[1] = torch.export.Dim("seq", min=2, max=64)
    try:
        cap = capture_module(model, example, (dims,), name=name)
        report = build_captured(cap, tmp / f"{name}.pkg", BuildOptions(targets=(Target("cpu", "x86-64-v3"),)), cache)
        torch.manual_seed(3)
        xs = inputs(3)
        if example[0].dtype == torch.int64:
            xs = (torch.randint(0, 128, (3, 17)),)  # another sequence length from the same package
        with torch.no_grad():
            want = model(*xs).numpy()
        got = aotc.load(tmp / f"{name}.pkg", device="cpu")(*[x.numpy() for x in xs])
        scale = max(float(np.abs(want).max()), 1e-30)
        return {"model": name, "ok": True, "kernels": report.kernels, "max_rel_err": float(np.abs(got - want).max() / scale),
                "output_max": float(np.abs(want).max())}  # fmt: skip
    except Exception as e:
        return {"model": name, "ok": False, "error": f"{type(e).__name__}: {e}"}


def main() -> None:
    args = sys.argv[1:]
    out = Path(args.pop(0)) if args and args[0].endswith(".json") else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="aotc-survey-") as tmp:
        for name, (make, inputs) in _models().items():
            if args and name not in args:
                continue
            row = survey(name, make, inputs, Path(tmp) / "cache", Path(tmp))
            rows.append(row)
            status = f"ok  err {row['max_rel_err']:.1e}  {row['kernels']} kernels" if row["ok"] else "FAIL " + row["error"]
            print(f"{name:16s} {status.splitlines()[0][:160]}", flush=True)
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} built and matched eager")
    if out:
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "torch": torch.__version__, "transformers": _t().__version__, "rows": rows}  # fmt: skip
        out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
