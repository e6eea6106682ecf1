# The controller of profile "local-mpi": clients and engines are on this machine, so listen on
# loopback only. Connection files are written owner-readable only (0600, in a 0700 directory).
c = get_config()  # noqa: F821

c.IPController.ip = "127.0.0.1"

# An engine whose heartbeat the controller has not heard within 30 s of answering its registration
# (ipyparallel's default) is dropped, and stays unregistered for good: give a loaded machine the same
# 120 s as the wait for the engines (see ipengine_config.py).
c.IPController.registration_timeout = 120
