"""mpi4py layer: version equals the matrix; a 2-rank allreduce over MPI in one container."""


def test_version(host, layer):
    out = host.check_output("python3 -c 'import mpi4py; print(mpi4py.__version__)'")
    assert out == layer["version"]


def test_two_rank_allreduce(host):
    program = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
               "print(c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1))")
    out = host.run(f'mpirun --allow-run-as-root --oversubscribe -np 2 python3 -c "{program}"')
    assert out.rc == 0, out.stderr
    assert sorted(out.stdout.strip().splitlines()) == ["0 2 3", "1 2 3"]
