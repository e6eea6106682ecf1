"""The cluster helpers on a real 2-engine local-mpi cluster (ipcontroller + mpiexec'd ipengines).

References: training through the cluster equals the same config under `mpiexec downpour train`; the
study's CSV is the same whichever launcher filled it; a failure names its rank and traceback; a hang
or an interrupt leaves fresh engines behind.
"""

import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import cluster_jobs
import pandas as pd
import psutil
import pytest
from conftest import BIN, alive, engine_pythonpath, explain, ipcluster_daemon, launch_env, mpiexec, read_json

from downpour_lib import TrainConfig
from downpour_lib.cluster import (
    ClusterError,
    ClusterRunError,
    ClusterTimeout,
    connect,
    remote,
    running_clusters,
    start_cluster,
    stop_clusters,
    use_cluster,
)
from downpour_lib.cluster.failures import EngineFailure, cause_first
from downpour_lib.cluster.profiles import BUNDLED, install_profile, profile_dir
from downpour_lib.cluster.session import ClusterSession, rank_map
from downpour_lib.errors import ConfigError
from downpour_lib.study.load import COLUMNS as LOAD_COLUMNS
from downpour_lib.study.scaling import StudySpec
from downpour_lib.study.studies import Scaling, run_study

TINY = {"algorithm": "sync_ps", "model": "mlp", "dataset": "digits", "steps": 12, "batch_size": 16,
        "threads": 1, "eval_every": 6, "warmup_steps": 2}


def test_rank_map_comes_from_the_engines_not_their_ids():
    seen = {7: {"rank": 1, "size": 2, "host": "b", "pid": 11},
            3: {"rank": 0, "size": 2, "host": "a", "pid": 10}}
    engines = rank_map(seen)
    assert engines == {0: {"engine_id": 3, "host": "a", "pid": 10},
                       1: {"engine_id": 7, "host": "b", "pid": 11}}
    with pytest.raises(ClusterError, match="not one MPI world"):  # two separate mpiexec launches
        rank_map({0: {"rank": 0, "size": 1, "host": "a", "pid": 1},
                  1: {"rank": 0, "size": 1, "host": "a", "pid": 2}})


def test_every_engine_is_an_mpi_rank_and_jobs_come_back_by_rank(local_cluster):
    cluster = local_cluster
    assert cluster.size == 2 and sorted(cluster.engines) == [0, 1]
    import downpour_lib  # the engines run the code under test, not another checkout's

    assert cluster.run(cluster_jobs.library_file) == {0: downpour_lib.__file__, 1: downpour_lib.__file__}
    for engine_id, rank in cluster.ranks.items():  # ask each engine directly
        assert cluster.client[engine_id].apply_sync(remote.whoami)["rank"] == rank
    hello = cluster.hello()
    assert [hello[r].split(" on ")[0] for r in (0, 1)] == ["hello from rank 0 of 2",
                                                          "hello from rank 1 of 2"]
    table = cluster.allreduce()
    assert table["received"].tolist() == [3.0, 3.0] and table["sent"].tolist() == [1.0, 2.0]


def test_the_controller_listens_below_the_ephemeral_ports(local_cluster):
    """ipyparallel picks a controller's ports by binding port 0 and closing it, and binds them
    later: on a busy machine an outgoing connection took one in between (a CI run's "Address
    already in use" in the controller's output, engines registered that never answered). So
    start_cluster gives the controller a range of free ports no outgoing connection takes."""
    import json

    from downpour_lib.cluster.start import controller_ports
    from downpour_lib.launch_env import RENDEZVOUS_PORTS

    # below the ephemeral ports, and below where an srun step's store listens
    low = min(int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]),
              RENDEZVOUS_PORTS.start)
    first, last = map(int, controller_ports().split("-"))
    assert 10000 <= first and last < low and last - first + 1 == 40
    cluster = local_cluster.cluster
    info = json.loads((Path(cluster.profile_dir) / "security"
                       / f"ipcontroller-{cluster.cluster_id}-engine.json").read_text())
    ports = [p for v in info.values() for p in (v if isinstance(v, list) else [v])
             if isinstance(p, int) and p > 1024]
    assert len(ports) >= 8 and all(10000 <= p < low for p in ports), info


def test_training_through_the_cluster_equals_the_same_run_under_mpiexec(local_cluster, tmp_path):
    result = local_cluster.train(TrainConfig(**TINY))
    s = result.summary
    assert (s["world_size"], s["num_workers"], s["launcher"]) == (2, 1, "mpi")
    assert set(result.steps["rank"]) == {0, 1} and len(result.evals) == 2

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    proc = mpiexec(2, str(BIN / "downpour"), "train", *flags, "--summary-json", str(tmp_path / "m.json"))
    assert proc.returncode == 0, explain(proc)
    reference = read_json(tmp_path / "m.json")
    # same seed, data and world: the same training, step for step
    assert abs(s["final_train_loss"] - reference["final_train_loss"]) < 1e-6
    assert s["test_accuracy"] == reference["test_accuracy"]

    one = local_cluster.train(TrainConfig(**{**TINY, "algorithm": "ddp"}), world_size=1)
    assert (one.summary["world_size"], one.summary["backend"]) == (1, "none")  # a world of one


def test_bad_settings_fail_in_the_notebook_before_any_engine_works(local_cluster):
    with pytest.raises(ConfigError, match="world_size=3 is not valid: this cluster has 2 engines: train "
                                          r"on at most 2, or stop it .* use_cluster\('local-mpi', n=3\)"):
        local_cluster.train(TrainConfig(**TINY), world_size=3)
    with pytest.raises(ConfigError, match="world_size=0 is not valid: ranks to train on, 1 to 2"):
        local_cluster.train(TrainConfig(**TINY), world_size=0)  # it trained on every engine
    with pytest.raises(ConfigError, match="config='sync_ps' is not valid: a TrainConfig"):
        local_cluster.train("sync_ps")
    with pytest.raises(ConfigError, match="warmup_steps"):
        local_cluster.train(TrainConfig(**{**TINY, "warmup_steps": 50}))


def test_a_ranks_own_error_is_listed_before_its_peers_reports_of_losing_it():
    """Under load the peer's report can reach the client first: the failed rank closes its
    connections (its peers fail) before it answers the client. The symptoms go after the cause,
    and otherwise the order is kept."""
    lost = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
            "Connection closed by peer [127.0.0.1]:59062")
    silent = "CommTimeout: allreduce: rank 3 on vm went silent (no heartbeat within 3 s)"
    failures = [EngineFailure(0, 0, "vm", lost, ""), EngineFailure(2, 2, "vm", silent, ""),
                EngineFailure(1, 1, "vm", "RuntimeError: injected failure on rank 1", ""),
                EngineFailure(3, 3, "vm", "ValueError: another cause", "")]
    assert [f.rank for f in cause_first(failures)] == [1, 3, 0, 2]


def test_an_exception_on_one_rank_reaches_the_caller_with_rank_and_traceback(local_cluster):
    with pytest.raises(ClusterRunError) as caught:
        local_cluster.run(cluster_jobs.fail_on_rank, 1, 2, timeout_s=120)
    error = caught.value
    failure = error.failures[0]  # the cause comes first; rank 0 may follow, its allreduce broken
    assert (failure.rank, failure.error) == (1, "RuntimeError: injected failure on rank 1")
    assert "cluster_jobs.py" in failure.traceback and "fail_on_rank" in failure.traceback
    assert "ipyparallel" not in failure.traceback  # the job's frames, not the engine's machinery
    assert "(first: rank 1)" in str(error) and "rank 1 (engine" in str(error)
    # whatever rank 0 was left doing, the cluster is usable again
    assert local_cluster.run(remote.whoami, timeout_s=120)[1]["rank"] == 1


def test_ranks_left_waiting_on_a_failed_rank_are_restarted(local_cluster, monkeypatch):
    monkeypatch.setattr(local_cluster, "grace_s", 2.0)
    before = {e["pid"] for e in local_cluster.engines.values()}
    with pytest.raises(ClusterRunError) as caught:
        local_cluster.run(cluster_jobs.fail_or_sleep, 0, 600, timeout_s=300)
    error = caught.value
    assert [(f.rank, f.error) for f in error.failures] == [(0, "ValueError: rank 0 gives up")]
    assert (error.stuck, error.restarted) == ([1], True)
    assert "rank(s) 1 were still waiting" in str(error)
    assert not {e["pid"] for e in local_cluster.engines.values()} & before


def test_a_hung_run_times_out_and_leaves_fresh_engines(local_cluster):
    before = {r: e["pid"] for r, e in local_cluster.engines.items()}
    with pytest.raises(ClusterTimeout, match=r"ran past 3 s on rank\(s\) 1; the engines were restarted"):
        local_cluster.run(cluster_jobs.sleep_on_rank, 1, 600, timeout_s=3)
    after = {r: e["pid"] for r, e in local_cluster.engines.items()}
    assert sorted(after) == [0, 1] and not set(after.values()) & set(before.values())
    assert local_cluster.run(cluster_jobs.sleep_on_rank, 1, 0, timeout_s=120) == {0: 0, 1: 1}


def test_a_stopped_engine_is_named_as_the_silent_rank_not_the_one_that_waited(local_cluster,
                                                                            monkeypatch):
    monkeypatch.setattr(local_cluster, "grace_s", 2.0)
    before = {e["pid"] for e in local_cluster.engines.values()}
    stopped = local_cluster.engines[1]["pid"]
    with pytest.raises(ClusterTimeout) as caught:
        local_cluster.run(cluster_jobs.stop_on_rank, 1, 2, 5, timeout_s=120)
    error = caught.value
    assert error.silent == [1] and [f.rank for f in error.failures] == [0], str(error)
    assert str(error).startswith("stop_on_rank: rank(s) 1 went silent"), str(error)
    assert "waited 5 s in allreduce" in error.failures[0].error, error.failures[0]
    assert "the engines were restarted" in str(error)
    assert not alive(stopped), "the stopped engine outlived the restart"
    table = local_cluster.table()  # the new engines', not the pids the restart ended
    assert list(table["rank"]) == [0, 1] and not set(table["pid"]) & before, table
    assert all(alive(pid) for pid in table["pid"]), table
    assert local_cluster.run(cluster_jobs.sleep_on_rank, 1, 0, timeout_s=120) == {0: 0, 1: 1}
    assert not {e["pid"] for e in local_cluster.engines.values()} & before


def test_a_job_that_ends_itself_on_a_stopped_engine_still_names_it(local_cluster):
    """The mpi backend's watchdog ends the whole MPI job when a thread stuck inside MPI waits on a
    silent peer, and that can come before the run counts the stopped engine as silent (a race the
    stopped-engine test below lost once under load): every engine dies, and the run still names
    the stopped one as the silent rank and restarts the engines, not ClusterRunError with two dead
    engines left as they are."""
    before = {e["pid"] for e in local_cluster.engines.values()}
    stopped = local_cluster.engines[1]["pid"]
    with pytest.raises(ClusterTimeout) as caught:  # stopped 14 s of the 20 that count as silent
        local_cluster.run(cluster_jobs.stop_or_end_job, 1, 14, silent_s=20, timeout_s=120)
    error = caught.value
    assert error.silent == [1], str(error)
    assert re.search(rf"pid {stopped}: its process was stopped for \d+ s when the job ended",
                     str(error)), str(error)
    assert "the engines were restarted" in str(error) and "Traceback" not in str(error)
    assert not alive(stopped), "the stopped engine outlived the restart"
    assert local_cluster.run(cluster_jobs.sleep_on_rank, 1, 0, timeout_s=120) == {0: 0, 1: 1}
    assert not {e["pid"] for e in local_cluster.engines.values()} & before


# The job's timeout in the stopped-engine test: the test waits it out. 20 s cost 10 s more than this
# and tested nothing more (the other engine's wait ends at it, whatever its length).
TIMEOUT_S = 10


def test_an_engine_stopped_during_train_is_the_silent_rank_of_a_cluster_timeout(local_cluster):
    """SIGSTOP from outside (Ctrl-Z, a debugger, a stuck node) on one engine of a training run:
    ClusterTimeout names it in .silent, not ClusterRunError with ipyparallel's tracebacks; the
    engines restart and the next run trains."""
    config = TrainConfig(**{**TINY, "algorithm": "allreduce", "steps": 100_000, "eval_every": 0,
                            "final_eval": False, "timeout_s": TIMEOUT_S})
    before = {e["pid"] for e in local_cluster.engines.values()}
    victim = local_cluster.engines[1]["pid"]
    stopped_at: list[float] = []

    def stop() -> None:
        stopped_at.append(time.monotonic())
        os.kill(victim, signal.SIGSTOP)

    timer = threading.Timer(5.0, stop)  # start-up or training: either way, mid-call
    timer.start()
    try:
        with pytest.raises(ClusterTimeout) as caught:
            local_cluster.train(config)
        took = time.monotonic() - stopped_at[0]
    finally:
        timer.cancel()
        if alive(victim):
            os.kill(victim, signal.SIGCONT)
    error = caught.value
    assert error.silent == [1], str(error)
    text = str(error)
    assert text.startswith("allreduce on 2 rank(s): rank(s) 1 went silent"), text
    assert f"pid {victim}" in text or "heartbeat" in text, text
    assert "Traceback" not in text and "ipyparallel" not in text, text
    print(f"ClusterTimeout {took:.1f} s after the SIGSTOP, at timeout_s={TIMEOUT_S}")
    assert not alive(victim), "the stopped engine outlived the restart"
    again = local_cluster.train(TrainConfig(**TINY))
    assert again.summary["world_size"] == 2
    assert not {e["pid"] for e in local_cluster.engines.values()} & before


def test_interrupting_a_run_restarts_the_engines_and_keeps_the_caller(local_cluster):
    before = {e["pid"] for e in local_cluster.engines.values()}
    # what "interrupt kernel" does to a notebook: SIGINT to the process waiting on the engines. A
    # kernel turns SIGINT into KeyboardInterrupt; so must this test when it runs in the background
    # (`make test &` from a script), where it inherits SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            local_cluster.run(cluster_jobs.sleep_on_rank, 0, 600)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert not {e["pid"] for e in local_cluster.engines.values()} & before
    assert local_cluster.train(TrainConfig(**TINY)).summary["world_size"] == 2


def test_the_study_csv_does_not_depend_on_the_launcher(local_cluster, tmp_path):
    base = {"model": "mlp", "dataset": "synthetic-mnist", "batch_size": 16, "steps": 6,
            "warmup_steps": 2, "eval_every": 0, "threads": 1}
    specs = {name: StudySpec(algorithms=("ddp", "sync_ps"), workers=(1,), base=base, repeats=1,
                             csv=str(tmp_path / f"{name}.csv")) for name in ("mpiexec", "cluster")}
    by_mpiexec = run_study(Scaling(specs["mpiexec"]), log=lambda _: None)
    by_cluster = run_study(Scaling(specs["cluster"], launch=local_cluster.launch), log=lambda _: None)
    assert list(by_cluster.columns) == list(by_mpiexec.columns)
    assert by_cluster.run_id.tolist() == by_mpiexec.run_id.tolist()
    assert by_cluster.world_size.tolist() == [1, 2]
    measured = {"samples_per_s", "step_s", "data_s", "compute_s", "comm_s", "wait_s", "update_s",
                "wall_s", "timestamp", "final_train_loss", "test_loss", "test_accuracy",
                *LOAD_COLUMNS}  # how busy the machine was during each run
    same = [c for c in by_mpiexec.columns if c not in measured]
    pd.testing.assert_frame_equal(by_cluster[same], by_mpiexec[same])
    for column in ("final_train_loss", "test_loss"):  # the same training, whoever launched it
        assert (by_cluster[column] - by_mpiexec[column]).abs().max() < 1e-6

    # resuming the mpiexec CSV through the cluster runs nothing
    before = (tmp_path / "mpiexec.csv").read_text()
    log = []
    run_study(Scaling(specs["mpiexec"], launch=local_cluster.launch), log=log.append)
    assert (tmp_path / "mpiexec.csv").read_text() == before
    assert all(line.startswith("skip") for line in log) and len(log) == 2


def test_start_cluster_on_a_profile_that_runs_one_refuses_and_says_how_to_use_it(local_cluster):
    cluster_id = local_cluster.cluster.cluster_id
    with pytest.raises(ClusterError, match="already runs 1 cluster") as caught:
        start_cluster("local-mpi", n=3, activate=False, timeout_s=300)
    message = str(caught.value)
    assert f"connect('local-mpi', cluster_id={cluster_id!r})" in message, message
    assert f"`ipcluster stop --profile=local-mpi --cluster-id={cluster_id}`" in message, message
    assert [c.cluster_id for c in running_clusters("local-mpi")] == [cluster_id]  # no second one
    # what the message offers works, and leaves the first session's cluster running
    other = connect("local-mpi", cluster_id=cluster_id, activate=False)
    try:
        assert other.ranks == local_cluster.ranks
    finally:
        other.stop()
    assert sorted(local_cluster.hello()) == [0, 1]


def test_a_study_on_a_profile_that_runs_a_cluster_uses_that_cluster_and_leaves_it_running(
        local_cluster, tmp_path):
    """What notebook 02 tells Slurm users: `ipcluster start --profile=slurm-mpi`, then the study."""
    spec = StudySpec(algorithms=("ddp",), workers=(1,), repeats=1, csv=str(tmp_path / "runs.csv"),
                     base={"model": "mlp", "dataset": "synthetic-mnist", "batch_size": 16, "steps": 4,
                           "warmup_steps": 1, "eval_every": 0, "threads": 1})
    log = []
    runs = run_study(Scaling(spec, profile="local-mpi"), log=log.append)
    assert log[0] == (f"using the running local-mpi cluster (id {local_cluster.cluster.cluster_id!r}"
                      ", 2 engines) for 1 run(s); stop() leaves it running"), log
    assert runs.world_size.tolist() == [1]
    assert sorted(local_cluster.hello()) == [0, 1]  # not stopped by the study


def test_use_cluster_takes_the_running_cluster_with_the_engines_asked_for_and_leaves_it(
        local_cluster):
    """What notebooks 00 and 01 call: the profile's running cluster (here the module's), never a
    second one beside it; a count of engines it does not have is one line saying what it has."""
    cluster_id = local_cluster.cluster.cluster_id
    log = []
    with use_cluster("local-mpi", 2, activate=False, log=log.append) as session:
        assert not session.owned and session.ranks == local_cluster.ranks
        assert session.hello()[1].startswith("hello from rank 1 of 2")
    assert log == [f"using the running local-mpi cluster (id {cluster_id!r}, 2 engines); stop() "
                   "leaves it running"]
    assert [c.cluster_id for c in running_clusters("local-mpi")] == [cluster_id]
    assert sorted(local_cluster.hello()) == [0, 1]  # left running
    with pytest.raises(ConfigError) as more:
        use_cluster("local-mpi", 3, activate=False)
    assert str(more.value).startswith("engines=3 is not valid: profile 'local-mpi' runs a cluster "
                                      f"of 2 engines (cluster id {cluster_id!r})"), more.value
    assert ("ask for 2 (engines=2), or stop it (`ipcluster stop --profile=local-mpi "
            f"--cluster-id={cluster_id}`)") in str(more.value)  # without the id it finds no cluster
    with pytest.raises(ConfigError, match="engines=1 is not valid: .* ask for 2 "):
        use_cluster("local-mpi", 1, activate=False)  # a notebook's ranks are all the engines
    with use_cluster("local-mpi", 1, at_least=True, activate=False, log=None) as session:
        assert session.size == 2  # a study's runs take the ranks they need
    with use_cluster("local-mpi", 2, engines_per_node=2, activate=False, log=None) as session:
        assert session.size == 2
    for after in (session.hello, session.table):  # ipyparallel's 'sockets have been closed'
        with pytest.raises(ClusterError, match="this session of the 'local-mpi' cluster is stopped "
                                               r"\(its with block ended, or stop\(\) was called\)"):
            after()
    with pytest.raises(ConfigError, match="engines_per_node=1 is not valid: the running local-mpi "
                                          r"cluster .* has 2 on "):
        use_cluster("local-mpi", 2, engines_per_node=1, activate=False)
    assert sorted(local_cluster.hello()) == [0, 1]


def test_use_cluster_starts_one_only_when_none_runs_and_stops_what_it_started():
    install_profile("use-test", BUNDLED / "profile_local-mpi")
    log = []
    try:
        with use_cluster("use-test", 1, activate=False, log=log.append, timeout_s=300) as session:
            assert session.owned and session.size == 1
            assert [c.cluster_id for c in running_clusters("use-test")] == [session.cluster.cluster_id]
        assert log == ["starting a use-test cluster of 1 engine (none runs; stop() stops it)"]
        assert running_clusters("use-test") == []
    finally:
        stop_clusters("use-test")


def test_the_ranks_of_this_machine_are_known_by_machine_not_host_name():
    """The Slurm sandbox's nodes are namespaces of this machine with host names of their own
    (node1, node2): their engines' processes are this machine's, and their CPU time a study's
    own (``study.load``), not other processes' load. An engine on another machine is not,
    whatever its host name says."""
    me = remote.machine_id()
    seen = {0: {"rank": 0, "size": 3, "host": "node1", "pid": 101, "machine": me},
            1: {"rank": 1, "size": 3, "host": "node2", "pid": 102, "machine": me},
            2: {"rank": 2, "size": 3, "host": os.uname().nodename, "pid": 103, "machine": "elsewhere"}}
    session = ClusterSession(None, None, owned=False)
    session._map_ranks(seen)
    assert session.local_ranks == {0, 1} and session.local_pids() == [101, 102]


def test_a_real_clusters_engines_are_this_machines(local_cluster):
    assert local_cluster.local_ranks == {0, 1}
    engines = {e["pid"] for e in local_cluster.engines.values()}
    controller = local_cluster.cluster.controller.process.pid  # this session started it
    assert sorted(local_cluster.local_pids()) == sorted(engines | {controller})


def test_start_cluster_beside_ipcluster_start_refuses_until_ipcluster_stop():
    install_profile("daemon-test", BUNDLED / "profile_local-mpi")
    ipcluster = [str(BIN / "ipcluster")]
    try:
        ipcluster_daemon("daemon-test", 1)
        with pytest.raises(ClusterError) as caught:
            start_cluster("daemon-test", n=1, activate=False)
        message = str(caught.value)
        assert "use it with connect('daemon-test')" in message, message
        assert "`ipcluster stop --profile=daemon-test`" in message, message
        proc = subprocess.run([*ipcluster, "stop", "--profile=daemon-test"], env=launch_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, explain(proc)
        assert not running_clusters("daemon-test")
    finally:
        stop_clusters("daemon-test")


@pytest.mark.cluster  # ipcluster start, not start_cluster: the tiers would call it `ranks`
def test_engines_register_with_a_controller_that_answers_late():
    """A controller busy on a loaded machine answered the engines' registration after ipyparallel's
    5 s: the engines gave up and exited, and notebook 01 on the running slurm-mpi cluster waited its
    120 s for none ("0 of 2 engines registered", CI). The bundled profiles wait as long as that."""
    install_profile("late-test", BUNDLED / "profile_local-mpi")
    hold_s = 8.0  # past the engines' old limit, 5 s

    def stamps(what: str) -> list[float]:  # of the engines' log lines that say ``what``
        return [stamp(line) for line in engine_log_lines("late-test") if what in line]

    try:
        started, controller, suspended = controller_stopped_before_its_engines("late-test")
        while len(stamps("Registering with controller")) < 2:  # both ask, unanswered
            assert time.time() < suspended + 120, "the engines never asked to register"
            time.sleep(0.5)
        time.sleep(hold_s)
        resumed = time.time()
        controller.resume()
        session = connect("late-test", started.cluster_id, n=2, timeout_s=120, activate=False)
        try:
            assert sorted(session.engines) == [0, 1]  # both registered and answered their ranks
        finally:
            session.stop()  # a disconnect: ipcluster started it
        # the engines asked while the controller was stopped and were answered once it went on,
        # hold_s later: otherwise this tested nothing
        asked, done = stamps("Registering with controller"), stamps("Completed registration")
        assert len(asked) == 2 and all(t > suspended for t in asked), (asked, suspended)
        assert len(done) == 2 and all(t > resumed for t in done), (done, resumed)
    finally:
        stop_clusters("late-test")


@pytest.mark.cluster  # ipcluster start, as above
def test_a_wait_on_engines_that_gave_up_quotes_their_log():
    """Engines that gave up registering are gone from their launcher, so a wait that ends without
    them read no output file, and said only "0 of 2 engines registered" (all CI printed once).
    It quotes the profile's engine logs written since the controller started."""
    install_profile("gave-up-test", BUNDLED / "profile_local-mpi")
    with open(profile_dir("gave-up-test") / "ipengine_config.py", "a") as config:
        config.write("\nc.IPEngine.timeout = 2.0  # this test: engines that give up soon\n")
    try:
        started, controller, suspended = controller_stopped_before_its_engines("gave-up-test")
        deadline = suspended + 120
        while not any("Registration timed out" in line for line in engine_log_lines("gave-up-test")):
            assert time.time() < deadline, "no engine gave up"
            time.sleep(0.5)
        controller.resume()
        while running_clusters("gave-up-test")[0].engines:  # until ipcluster saw their job end
            assert time.time() < deadline, "ipcluster still lists the engines that gave up"
            time.sleep(0.5)
        with pytest.raises(ClusterError) as caught:
            connect("gave-up-test", started.cluster_id, n=2, timeout_s=5, activate=False)
        message = str(caught.value)
        assert message.startswith("0 of 2 engines registered within 5 s (an engine's log says: "
                                  "Registration timed out after 2.0 seconds)"), message
    finally:
        stop_clusters("gave-up-test")


def test_a_failed_wait_after_a_restart_quotes_no_log_of_the_engines_before_it():
    """A wait that ends without its engines quotes the profile's engine logs written since the
    controller started; after a restart those hold the engines before it too, whose complaint is
    not why the new ones are missing. It quotes only what was written since the restart, and says
    the controller may still list the old engines. (The complaint is written here, as an earlier
    engine of this controller would have left it.)"""
    install_profile("restart-test", BUNDLED / "profile_local-mpi")
    session = start_cluster("restart-test", n=2, activate=False, timeout_s=300,
                            engine_env={"PYTHONPATH": engine_pythonpath()})
    try:
        older = Path(session.cluster.profile_dir, "log", "ipengine-before-the-restart.log")
        older.write_text("2026-12-06 05:00:00.000 [IPEngine.0] CRITICAL | an engine before the restart\n")
        controller = psutil.Process(session.cluster.controller.process.pid)
        controller.suspend()  # the new engines cannot register
        try:
            session.restart_engines(wait=False)
            with pytest.raises(ClusterError) as caught:
                session.wait_for_engines(2, stale_pids=session._restarting, timeout_s=5)
        finally:
            controller.resume()
    finally:
        try:
            session.stop()
        finally:
            stop_clusters("restart-test")
    message = str(caught.value)  # the old engines, dead, are still listed by the stopped controller
    assert message.startswith("0 of 2 restarted engines answered (the controller lists 2, the old "
                              "ones among them until it sees they are gone) within 5 s; see the "
                              "engine logs in "), message


def test_engines_behind_a_dead_queue_of_the_controller_are_registered_but_do_not_answer():
    """A queue process of the controller that dies (in a CI run: its port taken between
    ipyparallel choosing and binding it) leaves the engines registered with the hub and out of
    reach. The wait says they registered and did not answer, and where the controller's output
    is; it used to say "2 of 2 engines registered", which pointed nowhere."""
    import json

    install_profile("queue-test", BUNDLED / "profile_local-mpi")
    session = start_cluster("queue-test", n=1, activate=False, timeout_s=300,
                            engine_env={"PYTHONPATH": engine_pythonpath()})
    try:
        cluster = session.cluster
        engine = json.loads((Path(cluster.profile_dir) / "security"
                             / f"ipcontroller-{cluster.cluster_id}-engine.json").read_text())
        output, controller = cluster.controller.output_file, psutil.Process(cluster.controller.process.pid)
        [queue] = [child for child in controller.children(recursive=True)  # the direct view's
                   if any(c.status == psutil.CONN_LISTEN and c.laddr.port == engine["mux"]
                          for c in child.net_connections("tcp"))]
        queue.kill()
        deadline = time.monotonic() + 30
        while alive(queue.pid):  # a zombie until the controller reaps it, which it does not
            assert time.monotonic() < deadline, "the killed queue process is still running"
            time.sleep(0.1)
        with pytest.raises(ClusterError) as caught:
            session.wait_for_engines(1, timeout_s=5)
    finally:
        try:
            session.stop()
        finally:
            stop_clusters("queue-test")
    message = str(caught.value)
    assert message.startswith("all 1 engines registered but 0 answered within 5 s (they are still "
                              "busy (a job still running, or importing slowly on a loaded "
                              "machine), or a queue of the controller is gone (its output"), message
    assert output in message and "stop the cluster and start it again" in message


def controller_stopped_before_its_engines(profile: str, delay_s: float = 8.0):
    """`ipcluster start --daemonize` of 2 engines that start ``delay_s`` after the controller (time
    to stop it first, on a loaded machine too), and the controller stopped (SIGSTOP): the cluster,
    its controller's process and when it was stopped."""
    ipcluster_daemon(profile, 2, f"--delay={delay_s}")  # returns once the controller is recorded
    [started] = running_clusters(profile)
    controller = psutil.Process(started.controller.process.pid)
    controller.suspend()
    return started, controller, time.time()


def engine_log_lines(profile: str) -> list[str]:
    """Every line of the profile's engine logs."""
    return [line for log in (profile_dir(profile) / "log").glob("ipengine-*.log")
            for line in log.read_text().splitlines()]


def stamp(log_line: str) -> float:
    """The time of an ipyparallel log line ("2026-12-05 16:58:25.889 [IPEngine.1] ...")."""
    return datetime.strptime(log_line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()


def test_a_failed_wait_quotes_the_last_complaint_of_the_engines_logs(tmp_path):
    """What an engine said before it gave up is what a wait that ended without it quotes (the
    CI's "0 of 2 engines registered" said nothing more): the last CRITICAL or ERROR line of
    ipyparallel, or an exception's last line, the newest log first."""
    from downpour_lib.cluster.running import EXCEPTION_LINE, engine_log_complaint

    older, newer, quiet = (tmp_path / f"ipengine-{n}.log" for n in ("older", "newer", "quiet"))
    older.write_text("2026-12-05 16:58:20.101 [IPEngine.1] INFO | Registering with controller\n"
                     "2026-12-05 16:58:25.889 [IPEngine.1] CRITICAL | Registration timed out after "
                     "5.0 seconds\n2026-12-05 16:58:25.889 [IPEngine.1] CRITICAL | \n")
    newer.write_text("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
                     "ModuleNotFoundError: No module named 'torch'\n"
                     "prterun detected that one or more processes exited with non-zero status\n")
    quiet.write_text("2026-12-05 16:58:25.889 [IPEngine.0] INFO | Completed registration with id 0\n")
    os.utime(older, (1, 1))  # written first
    assert engine_log_complaint([older, newer]) == "ModuleNotFoundError: No module named 'torch'"
    assert engine_log_complaint([older]) == "Registration timed out after 5.0 seconds"
    assert engine_log_complaint([quiet, tmp_path / "never-written.log"]) == ""
    # a controller's output, as a CI run's was when a queue died at its start: the queue's
    # exception, not the hub's routine complaints after it, is what a wait quotes
    controller = tmp_path / "ipcontroller.log"
    controller.write_text(
        "Process DirectScheduler:\nTraceback (most recent call last):\n  File \"zmq/devices/basedevice.py\""
        ", line 95, in _setup_sockets\nzmq.error.ZMQError: Address already in use (addr='tcp://127.0."
        "0.1:43191')\n2026-12-06 05:09:11.412 [IPController] ERROR | Monitor message without topic\n")
    assert engine_log_complaint([controller], pattern=EXCEPTION_LINE) == (
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:43191')")
    assert engine_log_complaint([controller]) == "Monitor message without topic"


def test_after_an_engine_dies_the_next_run_says_to_restart_the_engines(local_cluster):
    killed = local_cluster.engines[1]["pid"]
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 30  # the engine's nanny tells the controller at once
    while local_cluster.engines[1]["engine_id"] in local_cluster.client.ids:
        assert time.monotonic() < deadline, "the controller never noticed the engine died"
        time.sleep(0.1)
    # mpiexec takes the other rank down with it, so rank 0 may be gone too by now
    with pytest.raises(ClusterError, match=r"rank\(s\) (0, )?1 of 2 are gone .* call "
                                           r"cluster\.restart_engines\(\)"):
        local_cluster.hello()
    local_cluster.restart_engines()
    assert killed not in {e["pid"] for e in local_cluster.engines.values()}
    assert local_cluster.run(cluster_jobs.sleep_on_rank, 1, 0, timeout_s=120) == {0: 0, 1: 1}


def test_connect_without_a_running_cluster_says_how_to_start_one():
    with pytest.raises(ClusterError, match="ipcluster start --profile=local-mpi"):
        connect("local-mpi", cluster_id="nonexistent")



def test_stop_returns_once_every_process_of_the_cluster_is_gone():
    """Each engine has a nanny child (its own session) that, left alone, outlives the engine by
    15-20 s; stop() must not return before the engines, their nannies and mpiexec are gone."""
    # a profile of its own, so that this test does not need the module's cluster stopped
    install_profile("reap-test", BUNDLED / "profile_local-mpi")
    cluster = start_cluster("reap-test", n=2, activate=False, timeout_s=300)
    try:
        engines = [psutil.Process(e["pid"]) for e in cluster.engines.values()]
        nannies = [c for e in engines for c in e.children(recursive=True)]
        assert len(nannies) == 2 and all("ipyparallel.engine.nanny" in " ".join(n.cmdline())
                                         for n in nannies), nannies
        mpiexecs = {e.parent() for e in engines}
        assert len(mpiexecs) == 1, mpiexecs  # one mpiexec (prterun) started both engines
    finally:
        cluster.stop()
    left = [(p.pid, " ".join(p.cmdline())) for p in [*engines, *nannies, *mpiexecs] if alive(p.pid)]
    assert not left, f"still running after stop(): {left}"
