"""The leaves every layer may use: user errors and the one-line error report (``errors``), console output
(``console``), file checksums, output-path and disk-space checks, the package's version, and where a model's
folder is (``model_folders``). A module here imports nothing of the package outside ``common``."""
