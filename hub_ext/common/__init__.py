"""Hub-wide pieces every part uses: the clock, our tables in the hub database, run records,
metrics, notices, logs, templates, background passes.
"""
