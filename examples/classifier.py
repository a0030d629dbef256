"""A small classifier whose forward() returns a dict, so the package's outputs have names:
`aotc build examples/classifier.py -o classifier.pkg`, then `aotc.load("classifier.pkg")(x)["probs"]`."""

import torch
from torch import nn
from torch.export import Dim


class Classifier(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, classes))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        return {"logits": logits, "probs": torch.softmax(logits, dim=-1)}


torch.manual_seed(0)
model = Classifier().eval()
example_inputs = (torch.randn(4, 64),)
dynamic_shapes = {"x": {0: Dim("batch", min=1, max=256)}}
