"""llama.cpp's `llama-server` as a real engine behind the gateway, without a GPU.

`build` fetches the pinned `llama-cpp-python` sdist (it vendors llama.cpp's whole tree) and
compiles only `llama-server` into a git-ignored cache; `model` writes a tiny llama-architecture
GGUF with random weights and a locally made vocabulary; `server` starts and stops the processes
(`make run ARGS="--engine llama.cpp"`, the tests under tests/llamacpp).
"""
