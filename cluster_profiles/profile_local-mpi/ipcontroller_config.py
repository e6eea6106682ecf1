# The controller of profile "local-mpi": clients and engines are on this machine, so listen on
# loopback only. Connection files are written owner-readable only (0600, in a 0700 directory).
c = get_config()  # noqa: F821

c.IPController.ip = "127.0.0.1"
