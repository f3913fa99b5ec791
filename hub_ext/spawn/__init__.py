"""The spawn core both backends share: the member's choice of profile, the pre-start hooks, mounts,
limits, the spawn page and the spawn gate.
"""
