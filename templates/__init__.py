"""Jinja2 launch templates, shipped as package data."""
