"""Pictures of layouts and redistribution plans: a pure picture model, ASCII and matplotlib renderers.

`render_layout_png` and `render_plan_png` import matplotlib (Agg canvas) only when called.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .ascii import render_layout_ascii
from .model import Block, DeviceCell, DevicePanel, LayoutPicture, Panel, layout_picture
from .plan import render_plan_ascii, render_plan_png
from .png import render_layout_png

__all__ = [
    "Block", "Panel", "DeviceCell", "DevicePanel", "LayoutPicture", "layout_picture",
    "render_layout_ascii", "render_layout_png", "render_plan_ascii", "render_plan_png",
]

# Its modules by name, loaded on first use: spmdsim.programs.viz.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
