# Sourced by the shell tests that launch real MPI ranks: the one mpirun command line for this host
# (as root, oversubscribed, Open MPI over TCP on loopback, one torch thread per rank).
# (The helpers the CLI test scripts share are in tests/expect.bash.)
# Not a test itself (ctest registers only *.sh).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo -x OMP_NUM_THREADS=1)

