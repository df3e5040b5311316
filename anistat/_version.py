"""The package version, in a module of its own so every layer may import it (it imports nothing).

`pyproject.toml` reads it (``[tool.setuptools.dynamic]``), `anistat.__version__` re-exports it and
the bundle's manifest records it for a source tree that is not pip-installed.
"""

__version__ = "0.1.0"
