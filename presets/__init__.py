"""Built-in model and GPU presets, shipped as package data."""
