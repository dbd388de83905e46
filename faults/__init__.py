"""Fault injection for Disque clusters, checked against a recorded history.

A Jepsen-style harness: real nodes run inside a network namespace of their
own (only loopback, one 127.0.0.x address per node); a nemesis partitions,
slows, drops, pauses and kills them while producers and consumers record
every operation; a checker reads the history for lost jobs, deliveries
after a completed ACK, leaks, and ordered groups' order and exclusivity.
``python3 -m faults --help``.
"""

from __future__ import annotations

#: Exit status of a run that could not start for want of privileges or
#: tools (no namespace, no nft): the tests turn it into a skip.
EXIT_SKIPPED = 77
