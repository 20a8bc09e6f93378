"""YAML import/export of jobs, for promoting them between environments: a document
``{jobs: [...]}`` whose entries are :class:`Job` documents. Export leaves out bookkeeping
(version, timestamps) so a file diffs cleanly between environments."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from aegis_orchestration.model import Job

BOOKKEEPING = ("version", "created_at", "updated_at")


class JobFileError(ValueError):
    """A jobs file that cannot be read; ``problems`` names each faulty entry."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def job_document(job: Job) -> dict[str, Any]:
    doc = job.model_dump(mode="json", exclude=set(BOOKKEEPING), exclude_defaults=False)
    return doc


def dump_jobs(jobs: list[Job]) -> str:
    return yaml.safe_dump(
        {"jobs": [job_document(j) for j in sorted(jobs, key=lambda j: j.id)]},
        sort_keys=False,
        allow_unicode=True,
    )


def load_jobs(text: str) -> list[Job]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise JobFileError([f"not YAML: {err}"]) from None
    entries = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise JobFileError(["expected a mapping with a 'jobs' list"])
    jobs: list[Job] = []
    problems: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"jobs[{i}]: not a mapping")
            continue
        clean = {k: v for k, v in entry.items() if k not in BOOKKEEPING}
        try:
            jobs.append(Job.model_validate(clean))
        except ValidationError as err:
            where = entry.get("id", i)
            problems.extend(
                f"jobs[{where}] {'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in err.errors()
            )
    ids = [j.id for j in jobs]
    problems.extend(
        f"job id {d!r} appears twice" for d in sorted({x for x in ids if ids.count(x) > 1})
    )
    if problems:
        raise JobFileError(problems)
    return jobs
