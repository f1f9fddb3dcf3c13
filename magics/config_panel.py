"""The config panel's documented path (``from magics.config_panel import config_panel``),
kept for notebooks written against it; the panel lives in :mod:`magics.panel`."""

from magics.panel import ConfigPanel, config_panel

__all__ = ["ConfigPanel", "config_panel"]
