"""Real worker processes (notebook_launcher, torchrun, the CLI) and collectives; no kernel."""
