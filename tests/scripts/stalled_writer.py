"""A real training run whose second checkpoint write stalls halfway, to be SIGKILLed by the test.

Usage: stalled_writer.py CHECKPOINT_DIR. Trains `local` for 10 steps with a checkpoint every 5. The
first checkpoint (step 5) is written normally; while writing the second one (step 10) the file
object writes half of the bytes, flushes them to the temporary file, prints STALLED and the
temporary file's name, and sleeps until killed. Test-only instrumentation of the write, not a
library feature: the kill and everything the test reads afterwards are real.
"""

import os
import sys
import time

from downpour_lib import TrainConfig, checkpoint, make_trainer
from downpour_lib.comm.runtime import DistContext

real_fdopen = os.fdopen
writes = 0


class StallingFile:
    def __init__(self, f):
        self.f = f

    def write(self, data):
        global writes
        writes += 1
        if writes < 2:
            return self.f.write(data)
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        os.fsync(self.f.fileno())
        print("STALLED", os.readlink(f"/proc/self/fd/{self.f.fileno()}"), len(data), flush=True)
        while True:
            time.sleep(1)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


checkpoint.os.fdopen = lambda fd, mode: StallingFile(real_fdopen(fd, mode))
config = TrainConfig(algorithm="local", model="mlp", dataset="digits", steps=10, warmup_steps=1,
                     threads=1, checkpoint_dir=sys.argv[1], checkpoint_every=5)
make_trainer(config, DistContext.single()).run()
print("NOT STALLED", flush=True)
