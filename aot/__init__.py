"""aotc builder: model.py -> torch.export -> IR -> kernels -> C++ .so / Triton cubins -> package."""
