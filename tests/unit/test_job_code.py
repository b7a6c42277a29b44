"""Which files are the job's own (agent/memory/job_code.py): directories compared whole, so that
a job kept in a folder whose name starts like probing's, the standard library's or
site-packages' is still the job's (a checkout named `probing` runs its tests from one)."""

from __future__ import annotations

import os

from probing.agent.memory import job_code


def test_the_agents_files_the_standard_librarys_and_installed_packages_are_not_the_jobs() -> None:
    roots = job_code.library_roots()
    package = os.path.dirname(job_code.AGENT_DIR)
    assert job_code.is_library(os.path.join(job_code.AGENT_DIR, "memory", "holders.py"), roots)
    assert job_code.is_library(os.path.join(package, "protocol", "frames.py"), roots)
    assert job_code.is_library(os.__file__, roots)
    assert job_code.is_library("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", roots)
    assert job_code.is_library("/usr/lib/python3/dist-packages/numpy/core/numeric.py", roots)
    assert job_code.is_library("<frozen importlib._bootstrap>", roots)


def test_a_folder_whose_name_starts_like_one_of_those_holds_the_jobs_code() -> None:
    roots = job_code.library_roots()
    assert all(root.endswith(os.sep) for root in roots), roots  # whole directories, wherever installed
    assert not job_code.is_library(os.path.dirname(os.__file__) + "-notes" + os.sep + "train.py", roots)
    assert not job_code.is_library("/srv/site-packages-notes/train.py", roots)
    assert not (job_code.AGENT_DIR + "s" + os.sep + "train.py").startswith(job_code.AGENT_PREFIX)
    assert os.path.join(job_code.AGENT_DIR, "server.py").startswith(job_code.AGENT_PREFIX)
