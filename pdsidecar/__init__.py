"""The P/D routing sidecar: runs beside a decode engine and, when the EPP names a prefill pod
(``x-prefiller-host-port`` / ``x-prefiller-url``), runs the request's prefill there first and then
the decode on the local engine with the KV-transfer parameters the prefill returned."""
