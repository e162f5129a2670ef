"""The runtime every part stands on: the source contract and runner, the guarded execution
that isolates sources and stages, the collector declaration, the option machinery and the
agent process's own figures. Imports only the base modules at the top of `agent/`."""
