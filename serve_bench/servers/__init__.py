"""Model servers: the release served the way it ships, and the servers' deployment files.

A server is one folder behind one interface, as a runtime is a runner: ``triton/`` (its model repository and
``config.pbtxt``, checked with Triton's own schema) and ``ovms/`` (OpenVINO Model Server's ``config.json``).
``deployment`` writes both for a released file from the serving settings the bench measured; ``tensors``
reads what every configuration must name from the file itself.
"""
