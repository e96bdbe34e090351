"""GPU backends (NVML, fake, null) behind one protocol. No Qt here; only the NVML module imports pynvml."""
