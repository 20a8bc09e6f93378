"""YAML import/export of jobs, for promoting them between environments: a document
``{jobs: [...]}`` whose entries are :class:`Job` documents. Export leaves out bookkeeping
(version, timestamps) so a file diffs cleanly between environments."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from aegis_orchestration.model import Job, JobError

BOOKKEEPING = ("version", "created_at", "updated_at")


@dataclass(frozen=True, slots=True)
class JobProblem:
    """One fault of a jobs file: the ``job`` (its id, else its position; None: the file as a
    whole), the ``field`` (a dotted path in the job, e.g. ``steps.0.step_type``, or the step,
    param or condition a tree check names, e.g. ``step notify``; None: the job as a whole) and
    the ``reason``."""

    job: str | None
    field: str | None
    reason: str

    def __str__(self) -> str:
        if self.job is None:
            return self.reason
        where = f"jobs[{self.job}]"
        return f"{where} {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


class JobFileError(ValueError):
    """A jobs file that cannot be read; ``problems`` names each faulty entry (``details``: the
    same as :class:`JobProblem`)."""

    def __init__(self, problems: list[str], details: list[JobProblem] | None = None) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.details = (
            details if details is not None else [JobProblem(None, None, p) for p in problems]
        )


def job_document(job: Job) -> dict[str, Any]:
    """The job as a jobs file holds it: every field but the bookkeeping, and ``source_id`` only
    where there is one (an id imported from tables that had to change)."""
    doc = job.model_dump(mode="json", exclude=set(BOOKKEEPING), exclude_defaults=False)
    for entity in (doc, *doc["steps"], *doc["params"], *doc["conditions"]):
        if entity.get("source_id") is None:
            entity.pop("source_id", None)
    return doc


def dump_jobs(jobs: list[Job]) -> str:
    return yaml.safe_dump(
        {"jobs": [job_document(j) for j in sorted(jobs, key=lambda j: j.id)]},
        sort_keys=False,
        allow_unicode=True,
    )


def load_jobs(text: str) -> list[Job]:
    """The jobs of a YAML (or JSON) document ``{jobs: [...]}``; :class:`JobFileError` listing
    every problem when any job is not valid."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise JobFileError([f"not YAML: {err}"]) from None
    jobs, problems = check_jobs(doc)
    if problems:
        raise JobFileError([str(p) for p in problems], problems)
    return jobs


# a tree check's subject: "step notify: ...", "param p1: ...", "condition c1: ..."
_SUBJECT = re.compile(r"^((?:step|param|condition) [^:\s]+): (.+)$", re.DOTALL)


def check_jobs(doc: Any) -> tuple[list[Job], list[JobProblem]]:
    """Every valid job of a parsed jobs document and every problem found (nothing stops at the
    first): the document's shape, each job's fields, each job's tree, ids used twice."""
    entries = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return [], [JobProblem(None, None, "expected a mapping with a 'jobs' list")]
    jobs: list[Job] = []
    problems: list[JobProblem] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(JobProblem(str(i), None, "not a mapping"))
            continue
        clean = {k: v for k, v in entry.items() if k not in BOOKKEEPING}
        try:
            jobs.append(Job.model_validate(clean))
        except ValidationError as err:
            problems.extend(_problems(str(entry.get("id", i)), err))
    ids = [j.id for j in jobs]
    problems.extend(
        JobProblem(d, "id", "appears twice") for d in sorted({x for x in ids if ids.count(x) > 1})
    )
    return jobs, problems


def _problems(job: str, err: ValidationError) -> list[JobProblem]:
    found: list[JobProblem] = []
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, JobError):  # the tree checks: one problem each
            for text in cause.problems:
                match = _SUBJECT.match(text)
                found.append(
                    JobProblem(job, match[1], match[2]) if match else JobProblem(job, None, text)
                )
            continue
        field = ".".join(str(p) for p in e["loc"]) or None
        found.append(JobProblem(job, field, str(e["msg"]).removeprefix("Value error, ")))
    return found
