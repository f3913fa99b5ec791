# GPU Cluster Hub: every setting comes from GPUHUB_* environment variables
# (hub_ext/settings/rows.py; docs: reference/settings).  Site additions go in
# jupyterhub_config.d/*.py (GPUHUB_CONFIG_DIR), loaded after this; never edit this file.
import sys

from hub_ext.config import Settings, apply_config
from hub_ext.ops.site_config import load_site_config
from hub_ext.settings import SettingError

try:
    settings = Settings.from_env()
except SettingError as e:  # stop before anything starts, naming every malformed variable
    sys.exit(f"GPU Cluster Hub does not start: malformed settings\n{e}")
apply_config(c, settings)  # noqa: F821 (c is JupyterHub's config object)
load_site_config(c, settings.config_dir)  # noqa: F821
