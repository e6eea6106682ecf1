# The controller of profile "slurm-mpi". Its traffic leaves this machine (engines connect from compute
# nodes), so CurveZMQ encrypts and authenticates every connection: engines and clients need the
# controller's public key, which only the owner-readable (0600) connection files in the profile's
# 0700 security directory hold; ipcluster passes it to the engine job in its environment.
c = get_config()  # noqa: F821

c.IPController.enable_curve = True

# An engine whose heartbeat the controller has not heard within 30 s of answering its registration
# (ipyparallel's default) is dropped, and stays unregistered for good: give a loaded machine the same
# 120 s as the wait for the engines (see ipengine_config.py).
c.IPController.registration_timeout = 120
