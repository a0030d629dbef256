"""A stand-in for Triton Inference Server's ``triton_python_backend_utils`` (the python backend's module), with the
part of its API a backend model uses: Tensor, get_input_tensor_by_name, InferenceRequest/Response, TritonError.
The real module exists only inside Triton's python-backend stub process; tests put this folder on sys.path."""

from __future__ import annotations

import numpy as np


class TritonError:
    def __init__(self, message: str, code: int = 0) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise TypeError("pb_utils.Tensor needs a C-contiguous numpy array")  # as the real one refuses
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    def __init__(self, inputs: list[Tensor], requested_output_names: list[str] | None = None) -> None:
        self._inputs = inputs
        self._outputs = requested_output_names or []

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
        self._outputs = output_tensors
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)
