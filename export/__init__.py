"""Portable policies: a trained policy as one ONNX graph (`rlgate export`), and acting with it in onnxruntime.

`contract` names the graph's inputs, outputs and metadata (docs/onnx.md); `runtime` runs an exported file with
onnxruntime and numpy alone (no torch: `rlgate.OnnxPolicy`); the other modules build the graph from a policy's
pieces and module with torch (`graph`, `pieces`, `actions`), write it (`onnx_file`, `checkpoint`) and let the
inference server act with it (`serving`).
"""
