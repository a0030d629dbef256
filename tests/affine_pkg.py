"""Shared test helpers (imported, not fixtures): a tiny hand-written package (y = (x @ W + b) * scale, relu(y)) built without the builder.

The C++ library implements cpp_templates/aotc_abi.h by hand and is compiled once per session with g++.
It checks the ABI's alignment promises, returns an error for NaN inputs (to test error propagation), and
takes -DSCALE=k to make a library that computes something else (to test that two loads never mix up)
and -DFAKE_ABI=n to report another ABI version; -DMARK_LOAD makes its constructor create the file named by
$AOTC_TEST_LOADED (so a test can tell that no package code ran before a refusal).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from aotc.cpu_features import LEVEL_FEATURES
from aotc.schema import INTERFACE_MARK, CpuTarget, Manifest, ModelInfo, Symbol, TensorSpec, cpu_interface
from aotc_build.package import weights_member

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "cpp_templates"

AFFINE_CPP = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "aotc_abi.h"
#ifndef SCALE
#define SCALE 1
#endif

static int32_t g_threads = 0;

#ifdef MARK_LOAD  // proves, in tests, whether the library's code ever ran: its constructor leaves a file
#include <stdlib.h>
__attribute__((constructor)) static void aotc_test_mark(void) {
    const char* p = getenv("AOTC_TEST_LOADED");
    if (p) { FILE* f = fopen(p, "w"); if (f) fclose(f); }
}
#endif

int32_t aotc_abi_version(void) {
#ifdef FAKE_ABI
    return FAKE_ABI;
#else
    return AOTC_ABI_VERSION;
#endif
}
void aotc_set_num_threads(int32_t n) { g_threads = n; }

// inputs: x[s0, 4] f32, scale[s0] f32; weights: W[4, 3] f32, b[3] f32; outputs: y[s0, 3], relu[s0, 3]
int32_t aotc_run(const int64_t* syms, const void* const* inputs, void* const* outputs,
                 const void* const* weights, void* arena, char* err, size_t errlen) {
    const int64_t n = syms[0];
    const float* x = (const float*)inputs[0];
    const float* scale = (const float*)inputs[1];
    const float* W = (const float*)weights[0];
    const float* b = (const float*)weights[1];
    if (((uintptr_t)W | (uintptr_t)b | (uintptr_t)arena) % 64) {
        snprintf(err, errlen, "misaligned weights or arena");
        return 2;
    }
    for (int64_t i = 0; i < n * 4; i++) {
        if (isnan(x[i])) {
            snprintf(err, errlen, "x contains NaN at row %lld", (long long)(i / 4));
            return 3;
        }
    }
    float* tmp = (float*)arena;  // n*3 floats
    #pragma omp parallel for if (n > 16) num_threads(g_threads > 0 ? g_threads : 2)
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++) {
            float acc = b[j];
            for (int k = 0; k < 4; k++) acc += x[i * 4 + k] * W[k * 3 + j];
            tmp[i * 3 + j] = acc * scale[i] * SCALE;
        }
    }
    float* y = (float*)outputs[0];
    float* relu = (float*)outputs[1];
    memcpy(y, tmp, (size_t)n * 3 * sizeof(float));
    for (int64_t i = 0; i < n * 3; i++) relu[i] = tmp[i] > 0 ? tmp[i] : 0;
    return 0;
}
"""

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def reference(x: np.ndarray, scale: np.ndarray, k: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    y = ((x @ W + B) * scale[:, None] * k).astype(np.float32)
    return y, np.maximum(y, 0)


def affine_manifest(level: str = "x86-64-v2", lib: str = "cpu/x86-64-v2/model.so") -> Manifest:
    """The manifest of the affine package (members are filled in by write_package)."""
    weights, _ = weights_member([("W", W), ("b", B)])
    return Manifest(
        model=ModelInfo("affine", "0" * 64),
        build={"aotc": "0.1.0", "gcc": "test"},
        symbols=(Symbol("s0", "batch", 1, 64),),
        inputs=(TensorSpec("x", "float32", ("s0", 4)), TensorSpec("scale", "float32", ("s0",))),
        outputs=(TensorSpec("y", "float32", ("s0", 3)), TensorSpec("relu", "float32", ("s0", 3))),
        weights=weights,
        targets=(
            CpuTarget(
                level=level,
                features=LEVEL_FEATURES[level],
                library=lib,
                abi_version=1,
                arena_bytes="s0*12",
                compiler="g++ (test)",
                flags=("-O2", "-fopenmp"),
                kernels=("affine",),
            ),
        ),  # fmt: skip
    )




def affine_interface_cpp(m: Manifest | None = None) -> str:
    """The interface record (aotc.schema.interface_text) the builder embeds in every library, for AFFINE_CPP
    in the package of manifest ``m`` (default: ``affine_manifest()``)."""
    m = m or affine_manifest()
    text = (INTERFACE_MARK.decode() + cpu_interface(m, m.cpu_targets[0])).replace("\\", "\\\\").replace('"', '\\"')
    return f'\nextern "C" __attribute__((used, visibility("default"))) const char aotc_interface[] = "{text}";\n'
