"""Tests by kind: unit/, runtime/, kernel/, browser/, xla/ (the helpers sit here, at the top)."""
