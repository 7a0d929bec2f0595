"""Which process and which job a record belongs to, from the launcher's variables."""

from __future__ import annotations

import pytest

from telemetry_jit import identity
from telemetry_jit.identity import IdentityError, IdentityTracker, from_environment, run_id, short_run_id

LAUNCHER_VARIABLES = (
    "RANK",
    "GLOBAL_RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "TORCHELASTIC_RUN_ID",
    "LSB_JOBID",
    "PMIX_NAMESPACE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_MCA_ess_base_jobid",
    identity.RUN_ID_VARIABLE,
)


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_process_without_launcher_variables_is_rank_zero_of_one() -> None:
    me = from_environment()
    assert (me.rank, me.local_rank, me.world_size) == (0, 0, 1) and me.node


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, (3, 1, 8)),
        ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}, (5, 1, 16)),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, (2, 0, 4)),
        ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, (1, 1, 2)),  # a local launcher: the rank is the local rank
    ],
)
def test_each_launchers_variables_give_the_rank(
    variables: dict[str, str], expected: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    me = from_environment()
    assert (me.rank, me.local_rank, me.world_size) == expected


@pytest.mark.parametrize("value", ["", "../../x", "²", "-1", "1.5", " 2x"])
def test_a_rank_variable_that_is_no_rank_is_an_error_naming_it(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", value)
    with pytest.raises(IdentityError, match=rf"RANK={value!r} is not a valid rank"):
        from_environment()


def test_a_rank_beyond_the_world_size_is_an_error_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(IdentityError, match="RANK=5 is not a rank of a job of WORLD_SIZE=2 \\(ranks are 0 to 1\\)"):
        from_environment()


def test_a_world_size_of_zero_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "0")
    with pytest.raises(IdentityError, match="WORLD_SIZE='0' is not a valid world size"):
        from_environment()


def test_what_the_trainer_learns_wins_and_changes_the_version() -> None:
    tracker = IdentityTracker()
    assert tracker.current().rank == 0
    version = tracker.version
    tracker.update(rank=1, local_rank=1, world_size=2)
    assert (tracker.current().rank, tracker.current().world_size, tracker.version) == (1, 2, version + 1)
    tracker.update(rank=1, local_rank=1, world_size=2)
    assert tracker.version == version + 1  # unchanged: exporters need not re-encode


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"TORCHELASTIC_RUN_ID": "c0ffee", "SLURM_JOB_ID": "77"}, "torchrun-c0ffee"),
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}, "slurm-77"),  # torchrun without --rdzv-id
        # torchrun without --rdzv-id and no store to share an id through: the rendezvous address, the last resort
        ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node7", "MASTER_PORT": "29500"}, "torchrun-node7:29500"),
        ({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "2"}, "slurm-77.2"),
        ({"LSB_JOBID": "123"}, "lsf-123"),
        ({"PMIX_NAMESPACE": "slurm.pmix.77.0"}, "mpi-slurm.pmix.77.0"),
        ({identity.RUN_ID_VARIABLE: "mine", "TORCHELASTIC_RUN_ID": "c0ffee"}, "mine"),  # the user's wins
    ],
)
def test_the_run_id_is_the_launchers_job_id(
    variables: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert run_id() == expected
    assert run_id() == expected  # and stays, for the ranks this process launches


def test_without_a_launcher_a_run_id_is_made_once_and_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    first = run_id()
    assert len(first) == 32 and run_id() == first
    import os

    assert os.environ[identity.RUN_ID_VARIABLE] == first


@pytest.mark.parametrize(
    ("run", "shown"),
    [
        ("0123456789abcdef0123456789abcdef", "01234567"),
        ("torchrun-ec9d81bf-322e-4a10-8ea7-7c50308aef83", "torchrun-ec9d81bf"),
        ("slurm-4242.0", "slurm-4242.0"),
        ("torchrun-node7:29500", "torchrun-node7:29500"),
        ("my-run", "my-run"),
        ("a11a11a11a11", "a11a11a11a11"),
    ],
)
def test_run_ids_are_shown_short_but_keep_the_launchers_name(run: str, shown: str) -> None:
    assert short_run_id(run) == shown
