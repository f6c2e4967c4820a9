"""The model families and their registry: one folder per family (architecture, pretraining data, presets, HF
weight map, run export), and :data:`FAMILIES`, the one list every other module asks."""

from __future__ import annotations

from .registry import FAMILIES, Family, folder_family, get_family, load, model_class

__all__ = ["FAMILIES", "Family", "folder_family", "get_family", "load", "model_class"]
