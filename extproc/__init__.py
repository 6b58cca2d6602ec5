"""The Envoy ext_proc protocol layer shared by BBR and the EPP.

`stream.py` runs one ext_proc stream (the state machine); services implement the small
`Processor` protocol with plain Python values and never touch protobuf messages.
"""
