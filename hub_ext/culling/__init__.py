"""Culling: the hub-side culler (idle GPUs, maximum age), its rules, and jupyterhub-idle-culler's
configuration.
"""
