"""Example pipelines: copy them, change the parsing and the sinks, keep the shape.

* :mod:`jobs.produce_events`: generate an order-events dataset (Parquet) and
  write it to a queue with the Spark sink.
* :mod:`jobs.stream_aggregates`: read the queue with the streaming source,
  parse JSON, drop redelivered jobs by job ID, compute windowed aggregates
  with a watermark, write Parquet with a checkpoint.
* :mod:`jobs.worker`: a plain Python worker (no Spark): GETJOB, WORKING
  heartbeats, ACK on success, NACK on failure, a dead-letter queue.
* :mod:`jobs.demo`: all of it end to end on a node it starts and stops.

Each runs with ``python -m jobs.<name> --help``; defaults point at
127.0.0.1:7711.
"""
