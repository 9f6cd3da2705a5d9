"""What every rlgate service process is made of: its gRPC server (health, reflection, auth, TLS), its
HTTP app, running until a signal, and the settings fields the services share.

The inference server and the learner both build on this room and never on each other.
"""
