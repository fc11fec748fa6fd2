"""The benchmark harness: servers under test (:mod:`.server`, :mod:`.floor`, cluster
deployments), load generators (:mod:`.load`), probes, A/B rounds and reports."""
