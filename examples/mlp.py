"""A 3-layer MLP with GELU and a dynamic batch dimension: `aotc build examples/mlp.py -o mlp.pkg`."""

import torch
from torch import nn
from torch.export import Dim


class MLP(nn.Module):
    def __init__(self, d_in: int = 256, d_hidden: int = 512, d_out: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


torch.manual_seed(0)
model = MLP().eval()
example_inputs = (torch.randn(8, 256),)
dynamic_shapes = {"x": {0: Dim("batch", min=1, max=256)}}
