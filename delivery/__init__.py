"""Delivery of episode batches: an on-disk spool, and a shipper that streams it with acknowledgements."""
