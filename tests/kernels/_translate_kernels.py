"""Triton test kernels over ``kernels.translate``'s device functions (a module of their own:
``@triton.jit`` resolves names in its module's globals, so they cannot be test-local closures;
imported inside the tests, which need Triton or its interpreter)."""
import triton
import triton.language as tl

from sparsegnn.kernels.translate import _look_back


@triton.jit
def look_back_kernel(state_ptr, out_ptr, w, blocks, LOOK: tl.constexpr, SLEEP: tl.constexpr):
    """``out[0]``: ``_look_back`` of window ``w`` with ``blocks`` blocks over ``state``; ``out[1]``
    its error flag (``SLEEP < 0``: a state still zero where one was needed)."""
    tl.store(out_ptr, _look_back(state_ptr, out_ptr + 1, w, blocks, LOOK, SLEEP))
