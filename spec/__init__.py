"""What a served policy is: its env spaces, model config and connector pipelines, and the checkpoint
format that stores one. The server and the learner both build their policy through this, so they agree.
"""
