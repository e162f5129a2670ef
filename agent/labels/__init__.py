"""Node labels, the loop side: options, the `gpuscope labels` command, the loop that reads
the sources and publishes, and the hold policy that keeps labels through a lost GPU. What a
label's value is and how it reaches the Node object lives in exporters/labels/ (records in,
labels out); this room decides when, from which readings (docs/architecture.md)."""
