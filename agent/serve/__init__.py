"""HTTP: the server of /metrics, /healthz and /readyz, its wire format, the exporter-toolkit
web configuration (TLS, basic auth, headers) and the bcrypt queue behind it. Knows nothing
of sources or records: it serves what it is handed."""
