"""The benchmark harness: the server under test (from this tree or another git ref), load
generators over the SDK's client, probes (CPU, RSS, py-spy), A/B interleaving and reports.

Modules: :mod:`.server` (subprocess, source trees), :mod:`.load` (producers, pullers,
stall policies), :mod:`.probe`, :mod:`.store` (raw store limit), :mod:`.cells` (end-to-end
cells), :mod:`.ab` (interleaved A/B rounds) and :mod:`.report` (facts, statistics, tables).
"""
