"""The library-kernel templates of the Triton backend, one file each (matmul.py, conv.py), over the shared
tile heuristics and ``tl.dot`` spelling of dot.py. A template is a function
``(prog, kernel, index_i64, options, sm) -> TritonKernel`` that ``codegen/triton/__init__.py`` lists in its table.
"""
