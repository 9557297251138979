"""Make this process look like an AVX2-only x86 CPU to vLLM (used with ATEN_CPU_CAPABILITY=avx2).

vLLM chooses its kernel library and attention ISA from torch.cpu's cpuid probes, which
ATEN_CPU_CAPABILITY does not change; answering no here sends it to _C_AVX2 and "vec" attention,
so one machine checks that tests comparing kernels hold on the oldest ISA CI may have.
"""

import torch.cpu as _cpu

_cpu._is_avx512_supported = lambda: False
_cpu._is_avx512_bf16_supported = lambda: False
_cpu._is_amx_tile_supported = lambda: False
