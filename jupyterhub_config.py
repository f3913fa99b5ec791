# GPU Cluster Hub: every setting comes from GPUHUB_* environment variables (README.md).
from hub_ext.config import Settings, apply_config

apply_config(c, Settings.from_env())  # noqa: F821 (c is JupyterHub's config object)
