"""The top of the house: the command line, the configuration derived from every declared
option, the collector registry and the wiring of sources, stages, exporters and the server.
Nothing below imports from here."""
