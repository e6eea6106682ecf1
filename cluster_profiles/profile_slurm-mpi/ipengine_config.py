# The engines of this profile. ipyparallel's engine gives up and exits when the controller takes more
# than 5 s to answer its registration: a controller busy on a loaded machine (or a login node) did, and
# the engines of a started cluster never registered ("0 of 2 engines registered", seen in CI). The
# wait for the engines (ENGINES_TIMEOUT_S, 120 s) is the limit that counts; this one only must not end
# it first.
c = get_config()  # noqa: F821 -- ipyparallel provides get_config() when it loads this file

c.IPEngine.timeout = 120.0
