"""The global tier's gRPC API, generated from proto/globalrouter/api/ by `make proto` (checked in)."""
