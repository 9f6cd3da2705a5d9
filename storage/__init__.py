"""What rlgate keeps on disk: checkpoints (safetensors + JSON) and recorded episode files."""
