"""The local dev stack: certificates, the gateway and global-tier launchers behind `make run`,
the tests and the benchmarks. Not part of the product: the wheel and the image leave it out,
and no runtime package imports it (tests/unit/test_layers.py)."""
