"""The spawn core both backends share: one lifecycle (:mod:`.core`), what it asks of a
backend (:mod:`.backend`) and what a server runs (:mod:`.workload`); the member's choice of
profile (:mod:`.choice`, :mod:`.profiles`), the pre-start hooks (:mod:`.hooks`), the mounts,
the spawn page and the spawn gate.  The story: docs/explanation/spawn.md.
"""
