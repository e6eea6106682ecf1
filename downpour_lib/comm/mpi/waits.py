"""How every wait of the ``mpi`` backend spins, naps and tells a pause from silence: one home for
the Python waits (``liveness``, ``shm``, ``monitored``) and the C ones, which ``native`` compiles
with these values (``-DSPIN_S=...``: ``native.h``)."""

SPIN_S = 50e-6  # how long a wait spins before it naps (ranks in step meet within microseconds)
NAP_S = 1e-3  # the longest nap: how late a waiting rank may notice that its peers arrived
# A gap this long between two looks of a wait (or of the watchdog) means this process did not run:
# it was stopped (SIGSTOP; the launcher sends SIGCONT before it ends a job) or starved. The gap is
# not its peers' silence, so it does not count against them: a stopped rank, woken by the launcher
# ending the job, must not name the ranks it stopped waiting for.
PAUSED_S = 2.0

#: the C compiler's definitions of the same values
C_DEFINES = tuple(f"-D{name}={value!r}" for name, value in
                  (("SPIN_S", SPIN_S), ("NAP_S", NAP_S), ("PAUSED_S", PAUSED_S)))
