"""A real Chromium through Playwright, against JupyterLab."""
