"""The config panel (``%accelerate config``): ipywidgets in ``form``, the rules and state it
shows in the other modules (no widgets there, so they are unit-tested)."""

from magics.panel.form import ConfigPanel, config_panel

__all__ = ["ConfigPanel", "config_panel"]
