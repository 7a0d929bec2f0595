"""The job's own store: every rank of a torchrun job takes one run id from it, made fresh by the first to ask;
two jobs at one address get two."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from telemetry_jit import identity
from telemetry_jit.compat.distributed import shared_by_the_job

TORCHRUN_WITHOUT_AN_ID = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"}


@pytest.fixture(autouse=True)
def no_run_id(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("SLURM_JOB_ID", "LSB_JOBID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", identity.RUN_ID_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    yield
    identity.end_run()


def _agent_store(monkeypatch: pytest.MonkeyPatch, port: int = 0) -> dist.TCPStore:
    """A store as torchrun's agent hosts it, and the variables torchrun gives its workers to reach it."""
    store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    for name, value in {**TORCHRUN_WITHOUT_AN_ID, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}.items():
        monkeypatch.setenv(name, value)
    return store


def _a_rank_of_the_job() -> str:
    """One rank's configure: its run id, the environment then put back as found (the run ended)."""
    made = identity.run_id(share=shared_by_the_job)
    identity.end_run()
    assert identity.RUN_ID_VARIABLE not in os.environ
    return made


def test_every_rank_of_a_torchrun_job_without_an_id_takes_the_first_ranks_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _agent_store(monkeypatch)
    first, second = _a_rank_of_the_job(), _a_rank_of_the_job()
    assert first == second and first.startswith("torchrun-") and len(first) == len("torchrun-") + 32
    assert identity.short_run_id(first) == first[: len("torchrun-") + 8]
    assert store.get("telemetry_jit/run_id").decode() == first
    assert store.num_keys() >= 1


def test_two_torchrun_jobs_at_one_address_get_two_run_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    first_job = _agent_store(monkeypatch)
    port, first = first_job.port, _a_rank_of_the_job()
    del first_job  # the job ended; the next plain torchrun meets at the same address
    second = _a_rank_of_the_job_at(_agent_store(monkeypatch, port))
    assert first != second and os.environ["MASTER_PORT"] == str(port)


def _a_rank_of_the_job_at(store: dist.TCPStore) -> str:
    made = _a_rank_of_the_job()
    assert store.get("telemetry_jit/run_id").decode() == made
    return made


def test_without_a_reachable_store_the_rendezvous_address_is_the_last_resort(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**TORCHRUN_WITHOUT_AN_ID, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert shared_by_the_job("torchrun-mine", timeout_s=1) is None  # nothing listens on port 1
    assert identity.run_id(share=lambda proposal: shared_by_the_job(proposal, timeout_s=1)) == "torchrun-127.0.0.1:1"


def test_a_launchers_own_id_or_the_users_needs_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(proposal: str) -> str:
        raise AssertionError("the store was asked")

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "my-rdzv-id")
    assert identity.run_id(share=never) == "torchrun-my-rdzv-id"
    identity.end_run()
    monkeypatch.setenv(identity.RUN_ID_VARIABLE, "named-by-the-user")
    assert identity.run_id(share=never) == "named-by-the-user"
    identity.end_run()
    assert os.environ[identity.RUN_ID_VARIABLE] == "named-by-the-user"  # the user's, left as found
