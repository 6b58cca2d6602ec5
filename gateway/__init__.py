"""Gateway-wide pieces: the configuration schema, the Envoy config renderer, the local launcher."""
