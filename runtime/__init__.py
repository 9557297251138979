"""rlplan runtime: executes a plan (FSDP2 + vLLM + Ray). Heavy imports happen lazily."""
